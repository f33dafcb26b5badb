package framework

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"time"
)

// Options change what a cluster runs. The zero value is what the
// framework's own tests get: pods are plain objects whose status the
// framework writes, on two Node objects it creates.
type Options struct {
	// RealNodes runs the control plane as a cluster with real kubelets
	// expects it (test/node, and upstream's e2e suite against them): no Node
	// objects are created (the kubelets register theirs), the ServiceAccount
	// admission is on and the controller-manager runs every controller that
	// needs no cloud, with what the service-account token and root CA
	// publishers need; the API server reaches kubelets at their InternalIP
	// with a client certificate of its own.
	RealNodes bool
	// Scheduler, if set, is a kube-scheduler binary to run (with RealNodes).
	Scheduler string
}

// realNodeControllers are the controller-manager's defaults: the
// cloud controllers among them do nothing without a cloud provider.
const realNodeControllers = "*"

func (c *Cluster) realNodeAPIServerArgs(args []string) ([]string, error) {
	if err := c.pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil); err != nil {
		return nil, err
	}
	args = slices.DeleteFunc(slices.Clone(args), func(a string) bool {
		return a == "--disable-admission-plugins=ServiceAccount"
	})
	return append(args,
		"--kubelet-client-certificate="+c.pki.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+c.pki.path("apiserver-kubelet-client.key"),
		// A node's name does not resolve on this machine.
		"--kubelet-preferred-address-types=InternalIP",
	), nil
}

func (c *Cluster) realNodeControllerFlags() []string {
	return []string{
		"--service-account-private-key-file=" + c.pki.path("sa.key"),
		"--root-ca-file=" + c.pki.path("ca.crt"),
	}
}

// startForRealNodes starts what RealNodes adds after the control plane.
func (c *Cluster) startForRealNodes() error {
	if c.opts.Scheduler == "" {
		return nil
	}
	kubeconfig, err := c.IssueKubeconfig("scheduler", "system:kube-scheduler", []string{"system:masters"})
	if err != nil {
		return err
	}
	s, err := c.start("kube-scheduler", exec.Command(c.opts.Scheduler,
		"--kubeconfig="+kubeconfig,
		"--authentication-kubeconfig="+kubeconfig,
		"--authorization-kubeconfig="+kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=0",
	))
	if err != nil {
		return err
	}
	select {
	case <-s.Exited():
		return fmt.Errorf("kube-scheduler exited: %v\n%s", s.Err(), s.LogTail(20))
	case <-time.After(time.Second):
	}
	return nil
}

// AdminKubeconfig is a cluster-admin kubeconfig (system:masters), for
// clients the framework does not build, such as upstream's e2e.test.
func (c *Cluster) AdminKubeconfig() string { return filepath.Join(c.Dir, "admin.kubeconfig") }
