package framework

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RemoteNodeName is the second node: its pods are wired to this node's
// namespace like the others, but the API says they run elsewhere.
const RemoteNodeName = "node-2"

// DefaultNamespace is where the framework creates pods and tests create services.
const DefaultNamespace = "default"

// Pod is a pod: a namespace with a pod server, and its API object.
type Pod struct {
	Name   string
	Labels map[string]string
	IPv4   string
	IPv6   string
	Netns  *Netns
	Server *Process
	node   string
	host   int // the last byte of IPv4
}

// PodOptions describe a pod to add.
type PodOptions struct {
	// Labels select the pod into services.
	Labels map[string]string
	// Ports the pod server answers on, TCP and UDP (default 8080).
	Ports []int
	// Remote places the pod on RemoteNodeName in the API.
	Remote bool
}

// AddPod creates a pod namespace attached to the node by a routed veth,
// starts its server, creates the Pod object and marks it running and ready
// (standing in for the kubelet).
func (c *Cluster) AddPod(ctx context.Context, name string, opts PodOptions) (*Pod, error) {
	host, err := c.allocateHost()
	if err != nil {
		return nil, err
	}
	ns, err := newNetns("pod-" + name)
	if err != nil {
		return nil, err
	}
	p := &Pod{Name: name, Labels: opts.Labels, Netns: ns, node: NodeName, host: host,
		IPv4: "10.244.0." + strconv.Itoa(host), IPv6: "fd00:244::" + strconv.FormatInt(int64(host), 16)}
	if opts.Remote {
		p.node = RemoteNodeName
	}
	nodeSide := "vp" + strconv.Itoa(host)
	if err := link(c.Node, nodeSide, ns, "eth0"); err != nil {
		return nil, err
	}
	if err := runAll(
		ipCmd(c.Node, "addr", "add", PodGatewayIPv4+"/32", "dev", nodeSide),
		ipCmd(c.Node, "addr", "add", "fd00:244::1/128", "dev", nodeSide, "nodad"),
		ipCmd(c.Node, "route", "add", p.IPv4+"/32", "dev", nodeSide),
		ipCmd(c.Node, "route", "add", p.IPv6+"/128", "dev", nodeSide),
		ipCmd(ns, "addr", "add", p.IPv4+"/32", "dev", "eth0"),
		ipCmd(ns, "addr", "add", p.IPv6+"/128", "dev", "eth0", "nodad"),
		ipCmd(ns, "route", "add", PodGatewayIPv4, "dev", "eth0", "scope", "link"),
		ipCmd(ns, "route", "add", "default", "via", PodGatewayIPv4, "dev", "eth0"),
		ipCmd(ns, "-6", "route", "add", "fd00:244::1", "dev", "eth0"),
		ipCmd(ns, "-6", "route", "add", "default", "via", "fd00:244::1", "dev", "eth0"),
	); err != nil {
		return nil, err
	}
	ports := opts.Ports
	if len(ports) == 0 {
		ports = []int{8080}
	}
	portList := make([]string, len(ports))
	for i, port := range ports {
		portList[i] = strconv.Itoa(port)
	}
	if p.Server, err = startProcess(c.Dir, "pod-"+name, ns.Command(podserverPath(), "-name", name, "-ports", strings.Join(portList, ","))); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.pods[name] = p
	c.mu.Unlock()
	if err := waitForLog(p.Server, "ready", 10*time.Second); err != nil {
		return nil, err
	}
	if err := c.createPodObject(ctx, p, ports); err != nil {
		return nil, err
	}
	return p, c.SetPodReady(ctx, name, true)
}

// allocateHost picks a pod's address: each once, then those of removed
// pods, oldest first (a long benchmark adds more pods than the range holds).
func (c *Cluster) allocateHost() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nextHost <= 250 {
		c.nextHost++
		return c.nextHost - 1, nil
	}
	if len(c.freeHosts) == 0 {
		return 0, fmt.Errorf("the framework's pod range is full")
	}
	host := c.freeHosts[0]
	c.freeHosts = c.freeHosts[1:]
	return host, nil
}

func (c *Cluster) createPodObject(ctx context.Context, p *Pod, ports []int) error {
	var containerPorts []v1.ContainerPort
	for _, port := range ports {
		containerPorts = append(containerPorts,
			v1.ContainerPort{Name: "tcp-" + strconv.Itoa(port), ContainerPort: int32(port), Protocol: v1.ProtocolTCP},
			v1.ContainerPort{Name: "udp-" + strconv.Itoa(port), ContainerPort: int32(port), Protocol: v1.ProtocolUDP})
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: DefaultNamespace, Labels: p.Labels},
		Spec: v1.PodSpec{
			NodeName:   p.node,
			Containers: []v1.Container{{Name: "server", Image: "podserver", Ports: containerPorts}},
		},
	}
	_, err := c.Client.CoreV1().Pods(DefaultNamespace).Create(ctx, pod, metav1.CreateOptions{})
	return err
}

// SetPodReady writes the pod's status as the kubelet would: running, with
// its IPs, and the Ready condition as given.
func (c *Cluster) SetPodReady(ctx context.Context, name string, ready bool) error {
	c.mu.Lock()
	p := c.pods[name]
	c.mu.Unlock()
	if p == nil {
		return fmt.Errorf("no pod %q", name)
	}
	obj, err := c.Client.CoreV1().Pods(DefaultNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	status := v1.ConditionFalse
	if ready {
		status = v1.ConditionTrue
	}
	now := metav1.NewTime(time.Now())
	hostIP := NodeIPv4
	obj.Status = v1.PodStatus{
		Phase:     v1.PodRunning,
		HostIP:    hostIP,
		HostIPs:   []v1.HostIP{{IP: hostIP}},
		PodIP:     p.IPv4,
		PodIPs:    []v1.PodIP{{IP: p.IPv4}, {IP: p.IPv6}},
		StartTime: &now,
		Conditions: []v1.PodCondition{
			{Type: v1.PodReady, Status: status, LastTransitionTime: now},
			{Type: v1.ContainersReady, Status: status, LastTransitionTime: now},
		},
	}
	_, err = c.Client.CoreV1().Pods(DefaultNamespace).UpdateStatus(ctx, obj, metav1.UpdateOptions{})
	return err
}

// RemovePod deletes the Pod object and its namespace.
func (c *Cluster) RemovePod(ctx context.Context, name string) error {
	c.mu.Lock()
	p := c.pods[name]
	delete(c.pods, name)
	c.mu.Unlock()
	if p == nil {
		return fmt.Errorf("no pod %q", name)
	}
	zero := int64(0)
	err := c.Client.CoreV1().Pods(DefaultNamespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	p.Server.Stop()
	if nsErr := p.Netns.delete(); err == nil {
		err = nsErr
	}
	c.mu.Lock()
	c.freeHosts = append(c.freeHosts, p.host)
	c.mu.Unlock()
	return err
}
