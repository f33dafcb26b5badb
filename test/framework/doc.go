// Package framework runs a small real cluster on this machine for the
// end-to-end tests, the demo and the benchmarks: etcd, kube-apiserver and
// kube-controller-manager (EndpointSlice controllers only) as processes,
// and a node, its pods and an external client as network namespaces.
//
// Every address below lives inside namespaces the framework creates (plus
// the host end of the node's uplink, where the API server listens); no
// packet leaves them.
//
//	host <-> node uplink    10.255.0.1/30 (host, API server) - 10.255.0.2 (node primary IP)
//	                        fd00:255::1/64 - fd00:255::2 (node primary IPv6)
//	node <-> external       10.255.1.1/24 (node) - 10.255.1.2 (external client)
//	                        fd00:255:1::1/64 - fd00:255:1::2
//	pods (routed /32 veths) 10.244.0.0/24 and fd00:244::/64 (gateway .1 / ::1 on the node side)
//	cluster CIDR            10.244.0.0/16, fd00:244::/56
//	service CIDRs           10.96.0.0/16, fd00:10:96::/112
//	external / LB IPs       10.255.2.0/24, 10.255.3.0/24 (routed to the node from the external namespace)
//
// With Options.RealNodes the uplink is instead an underlay: a bridge in
// the namespace rpx-underlay, 10.255.0.0/24, whose ports are the host's
// end (10.255.0.1) and the node's eth0 (10.255.0.2), and to which
// AddNodeNetns attaches more nodes (test/node puts its i-th at
// 10.255.0.<i+1>).
//
// Namespaces and host links are named with the prefix "rpx-", and every
// process started is recorded in a state file, so a run that was killed is
// cleaned up by the next one before it starts.
package framework
