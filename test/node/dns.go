//go:build realnode

package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
)

// ClusterDNS is a small stand-in for CoreDNS's kubernetes plugin (no
// CoreDNS is built here): it answers A, AAAA and CNAME queries for
// cluster.local names from the API's Services and EndpointSlices
// (<svc>.<ns>.svc, <hostname>.<svc>.<ns>.svc, <a-b-c-d>.<ns>.pod) and
// forwards nothing: other names get REFUSED, so no packet leaves the
// machine. It listens on the node's IP in the node's network namespace;
// the kube-dns Service (10.96.0.10) sends pods to it through the node's
// kube-proxy, as a cluster's DNS pods are reached.
type ClusterDNS struct {
	udp      net.PacketConn
	tcp      net.Listener
	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister
	cancel   context.CancelFunc
}

const (
	clusterDNSIP = "10.96.0.10"
	dnsZone      = "cluster.local."
	dnsTTL       = 5
)

// StartClusterDNS listens on ip:53 in the network namespace at nsPath (the
// test's own if empty) and creates kube-system/kube-dns with that address
// as its endpoint.
func StartClusterDNS(ctx context.Context, client kubernetes.Interface, nsPath, ip string) (*ClusterDNS, error) {
	d := &ClusterDNS{}
	listen := func() (err error) {
		if d.udp, err = net.ListenPacket("udp4", net.JoinHostPort(ip, "53")); err != nil {
			return err
		}
		d.tcp, err = net.Listen("tcp4", net.JoinHostPort(ip, "53"))
		return err
	}
	var err error
	if nsPath == "" {
		err = listen()
	} else {
		err = inNetns(nsPath, listen)
	}
	if err != nil {
		d.Stop()
		return nil, fmt.Errorf("cluster DNS: %w", err)
	}
	ctx, d.cancel = context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactory(client, 0)
	d.services = factory.Core().V1().Services().Lister()
	d.slices = factory.Discovery().V1().EndpointSlices().Lister()
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	go d.serveUDP()
	go d.serveTCP()
	if err := createKubeDNS(ctx, client, ip); err != nil {
		d.Stop()
		return nil, err
	}
	return d, nil
}

// Stop closes the listeners; the Service goes with the cluster.
func (d *ClusterDNS) Stop() {
	if d.cancel != nil {
		d.cancel()
	}
	if d.udp != nil {
		d.udp.Close()
	}
	if d.tcp != nil {
		d.tcp.Close()
	}
}

// inNetns runs f on a thread in the network namespace at path; sockets it
// opens stay in that namespace.
func inNetns(path string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		// The thread is never unlocked: it ends with the goroutine instead
		// of going back to the pool in the other namespace.
		runtime.LockOSThread()
		fd, err := os.Open(path)
		if err != nil {
			errc <- err
			return
		}
		defer fd.Close()
		if err := unix.Setns(int(fd.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}

func createKubeDNS(ctx context.Context, client kubernetes.Interface, ip string) error {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec: v1.ServiceSpec{ClusterIP: clusterDNSIP, Ports: []v1.ServicePort{
			{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP},
			{Name: "dns-tcp", Port: 53, Protocol: v1.ProtocolTCP},
		}},
	}
	if _, err := client.CoreV1().Services("kube-system").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kube-dns Service: %w", err)
	}
	ready := true
	port := int32(53)
	udp, tcp := v1.ProtocolUDP, v1.ProtocolTCP
	dns, dnsTCP := "dns", "dns-tcp"
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns-node", Namespace: "kube-system", Labels: map[string]string{
			discoveryv1.LabelServiceName: "kube-dns", discoveryv1.LabelManagedBy: "rapidproxy-test-node"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports: []discoveryv1.EndpointPort{
			{Name: &dns, Port: &port, Protocol: &udp}, {Name: &dnsTCP, Port: &port, Protocol: &tcp}},
	}
	if _, err := client.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kube-dns EndpointSlice: %w", err)
	}
	return nil
}

func (d *ClusterDNS) serveUDP() {
	buf := make([]byte, 1500)
	for {
		n, addr, err := d.udp.ReadFrom(buf)
		if err != nil {
			return
		}
		if resp, err := d.answer(buf[:n], 512); err == nil {
			_, _ = d.udp.WriteTo(resp, addr)
		}
	}
}

func (d *ClusterDNS) serveTCP() {
	for {
		conn, err := d.tcp.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			for {
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				var l [2]byte
				if _, err := readFull(conn, l[:]); err != nil {
					return
				}
				req := make([]byte, int(l[0])<<8|int(l[1]))
				if _, err := readFull(conn, req); err != nil {
					return
				}
				resp, err := d.answer(req, 65535)
				if err != nil {
					return
				}
				if _, err := conn.Write(append([]byte{byte(len(resp) >> 8), byte(len(resp))}, resp...)); err != nil {
					return
				}
			}
		}()
	}
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// answer builds the reply to one query.
func (d *ClusterDNS) answer(req []byte, limit int) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	name := strings.ToLower(q.Name.String())
	var answers []dnsmessage.Resource
	switch {
	case !strings.HasSuffix(name, "."+dnsZone):
		rh.RCode = dnsmessage.RCodeRefused
		rh.Authoritative = false
	default:
		rrs, found := d.lookup(strings.TrimSuffix(name, "."+dnsZone), q)
		if !found {
			rh.RCode = dnsmessage.RCodeNameError
		}
		answers = rrs
	}
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	for _, rr := range answers {
		var err error
		switch body := rr.Body.(type) {
		case *dnsmessage.AResource:
			err = b.AResource(rr.Header, *body)
		case *dnsmessage.AAAAResource:
			err = b.AAAAResource(rr.Header, *body)
		case *dnsmessage.CNAMEResource:
			err = b.CNAMEResource(rr.Header, *body)
		}
		if err != nil {
			return nil, err
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil, err
	}
	if len(out) > limit {
		return nil, errors.New("reply too long")
	}
	return out, nil
}

// lookup answers a name inside cluster.local (without the zone); found
// is false for NXDOMAIN.
func (d *ClusterDNS) lookup(rel string, q dnsmessage.Question) ([]dnsmessage.Resource, bool) {
	labelsOf := strings.Split(rel, ".")
	var ips []string
	switch {
	case len(labelsOf) == 3 && labelsOf[2] == "svc":
		svc, err := d.services.Services(labelsOf[1]).Get(labelsOf[0])
		if err != nil {
			return nil, false
		}
		if svc.Spec.Type == v1.ServiceTypeExternalName {
			target, err := dnsmessage.NewName(strings.TrimSuffix(svc.Spec.ExternalName, ".") + ".")
			if err != nil {
				return nil, false
			}
			return []dnsmessage.Resource{{Header: rrHeader(q, dnsmessage.TypeCNAME), Body: &dnsmessage.CNAMEResource{CNAME: target}}}, true
		}
		if svc.Spec.ClusterIP == v1.ClusterIPNone {
			ips = d.endpointIPs(svc, "")
		} else {
			ips = svc.Spec.ClusterIPs
		}
	case len(labelsOf) == 4 && labelsOf[3] == "svc":
		svc, err := d.services.Services(labelsOf[2]).Get(labelsOf[1])
		if err != nil || svc.Spec.ClusterIP != v1.ClusterIPNone {
			return nil, false
		}
		if ips = d.endpointIPs(svc, labelsOf[0]); len(ips) == 0 {
			return nil, false
		}
	case len(labelsOf) == 3 && labelsOf[2] == "pod":
		ip, err := netip.ParseAddr(strings.ReplaceAll(labelsOf[0], "-", "."))
		if err != nil {
			if ip, err = netip.ParseAddr(strings.ReplaceAll(labelsOf[0], "-", ":")); err != nil {
				return nil, false
			}
		}
		ips = []string{ip.String()}
	default:
		return nil, false
	}
	var rrs []dnsmessage.Resource
	for _, s := range ips {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		switch {
		case ip.Is4() && q.Type == dnsmessage.TypeA:
			rrs = append(rrs, dnsmessage.Resource{Header: rrHeader(q, dnsmessage.TypeA), Body: &dnsmessage.AResource{A: ip.As4()}})
		case ip.Is6() && q.Type == dnsmessage.TypeAAAA:
			rrs = append(rrs, dnsmessage.Resource{Header: rrHeader(q, dnsmessage.TypeAAAA), Body: &dnsmessage.AAAAResource{AAAA: ip.As16()}})
		}
	}
	return rrs, true
}

// endpointIPs are a headless Service's ready endpoint addresses, only
// those with the given hostname if one is given.
func (d *ClusterDNS) endpointIPs(svc *v1.Service, hostname string) []string {
	sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc.Name})
	slices, err := d.slices.EndpointSlices(svc.Namespace).List(sel)
	if err != nil {
		return nil
	}
	var ips []string
	for _, s := range slices {
		for _, ep := range s.Endpoints {
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			if !ready && !svc.Spec.PublishNotReadyAddresses {
				continue
			}
			if hostname != "" && (ep.Hostname == nil || *ep.Hostname != hostname) {
				continue
			}
			ips = append(ips, ep.Addresses...)
		}
	}
	return ips
}

func rrHeader(q dnsmessage.Question, t dnsmessage.Type) dnsmessage.ResourceHeader {
	return dnsmessage.ResourceHeader{Name: q.Name, Type: t, Class: dnsmessage.ClassINET, TTL: dnsTTL}
}
