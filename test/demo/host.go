package main

import (
	"context"
	"fmt"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// hostNode is the cluster's node namespace on this machine, with pods
// (framework.AddPod) that the services select, for the modes this
// machine's kernel has.
type hostNode struct {
	cluster *framework.Cluster
	mode    string
	client  *framework.Pod
	kp      *framework.KubeProxy
	try     string // a request for the shell's user to try
}

func (h *hostNode) addPods(ctx context.Context) ([]string, error) {
	for _, name := range []string{"web-1", "web-2", "web-3"} {
		if _, err := h.cluster.AddPod(ctx, name, framework.PodOptions{Labels: map[string]string{"app": "web"}}); err != nil {
			return nil, err
		}
	}
	var err error
	h.client, err = h.cluster.AddPod(ctx, "client", framework.PodOptions{})
	return nil, err
}

func (h *hostNode) run(ctx context.Context, rs []request) ([]framework.Reply, error) {
	say("Starting our kube-proxy (%s mode) in the node namespace: %s", h.mode, h.cluster.KubeProxy())
	var err error
	h.kp, err = h.cluster.StartKubeProxy("kube-proxy", h.cluster.KubeProxy(), h.cluster.KubeProxyConfig("mode: "+h.mode+"\n"))
	if err != nil {
		return nil, err
	}
	if err := h.kp.WaitHealthy(ctx, 60*time.Second); err != nil {
		say("kube-proxy is NOT healthy: %v", err)
	} else {
		say("kube-proxy is healthy.")
	}
	time.Sleep(2 * time.Second) // let the first sync after the last change land
	h.try = rs[0].proto + "://" + rs[0].addr
	replies := make([]framework.Reply, len(rs))
	for i, r := range rs {
		from := h.cluster.External
		if r.from == fromClient {
			from = h.client.Netns
		}
		replies[i], _ = from.Request(r.proto, r.addr, 2*time.Second) // no answer: a zero Reply
	}
	return replies, nil
}

func (h *hostNode) more() {
	say("In another terminal, `make demo-shell` opens a shell in the client pod (try: _output/bin/podserver -client %s).", h.try)
}

func (h *hostNode) ended() <-chan struct{} { return h.kp.Exited() }
func (h *hostNode) why() string            { return fmt.Sprintf("%v\n%s", h.kp.Err(), h.kp.LogTail(10)) }
func (h *hostNode) stop()                  {} // kube-proxy and the pods are the cluster's
