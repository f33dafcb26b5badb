package framework

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Kinds of endpoint change the churn makes.
const (
	ChangeAdd      = "add"
	ChangeRemove   = "remove"
	ChangeReady    = "ready"
	ChangeNotReady = "not-ready"
)

// EndpointChange is one change the churn made to its pods.
type EndpointChange struct {
	At   time.Time // just before its API write
	Kind string
	Pod  string
}

// ChurnOptions describe a run of endpoint changes.
type ChurnOptions struct {
	// Labels select the churned pods into the service; NamePrefix names them.
	Labels     map[string]string
	NamePrefix string
	// Pods is how many start (ready) and MaxPods (2 or more) the most
	// there are at a time.
	Pods, MaxPods int
	// Changes are made one every Interval.
	Changes  int
	Interval time.Duration
	// Grace is how long a removed pod keeps serving after its deletion
	// starts, as a pod's termination grace period: its endpoint turns
	// terminating at once, and the pod is gone only after Grace. With 0 the
	// pod and its object go at once (RemovePod), before any proxy can
	// know.
	Grace time.Duration
	Seed  uint64
}

// Churn owns the pods of a churn run.
type Churn struct {
	c      *Cluster
	opts   ChurnOptions
	rnd    *rand.Rand
	next   int
	ready  map[string]bool // the churn's live pods and their readiness
	ending sync.WaitGroup  // pods serving out their grace
	// names are the churn's pods by IPv4 address, removed ones included
	// (the latest, where the framework reused an address).
	names map[string]string
}

// NewChurn adds the churn's starting pods, all ready.
func (c *Cluster) NewChurn(ctx context.Context, opts ChurnOptions) (*Churn, error) {
	ch := &Churn{c: c, opts: opts, rnd: rand.New(rand.NewPCG(opts.Seed, 0)), ready: map[string]bool{}, names: map[string]string{}}
	for range opts.Pods {
		if _, err := ch.add(ctx); err != nil {
			return ch, err
		}
	}
	return ch, nil
}

func (ch *Churn) add(ctx context.Context) (string, error) {
	name := ch.opts.NamePrefix + strconv.Itoa(ch.next)
	ch.next++
	p, err := ch.c.AddPod(ctx, name, PodOptions{Labels: ch.opts.Labels})
	if err != nil {
		return name, err
	}
	ch.ready[name] = true
	ch.names[p.IPv4] = name
	return name, nil
}

// PodAt names the churn's pod that has or had the IPv4 address, or
// returns "".
func (ch *Churn) PodAt(address string) string { return ch.names[address] }

// Run makes the changes, one every Interval, chosen at random among those
// that leave at least one ready pod: add a pod (below MaxPods), remove one,
// or flip one's readiness. It returns them in order, once the pods it
// removed are gone.
func (ch *Churn) Run(ctx context.Context) ([]EndpointChange, error) {
	var changes []EndpointChange
	tick := time.NewTicker(ch.opts.Interval)
	defer tick.Stop()
	defer ch.ending.Wait()
	for range ch.opts.Changes {
		select {
		case <-ctx.Done():
			return changes, ctx.Err()
		case <-tick.C:
		}
		change, err := ch.change(ctx)
		changes = append(changes, change)
		if err != nil {
			return changes, fmt.Errorf("%s %s: %w", change.Kind, change.Pod, err)
		}
	}
	return changes, nil
}

func (ch *Churn) change(ctx context.Context) (EndpointChange, error) {
	var names []string
	readyCount := 0
	for name, ready := range ch.ready {
		names = append(names, name)
		if ready {
			readyCount++
		}
	}
	slices.Sort(names) // map order would make the seed meaningless
	pod := names[ch.rnd.IntN(len(names))]
	// A ready pod may leave only if another stays ready.
	canLose := !ch.ready[pod] || readyCount > 1
	kinds := []string{}
	if len(names) < ch.opts.MaxPods {
		kinds = append(kinds, ChangeAdd)
	}
	if canLose {
		kinds = append(kinds, ChangeRemove)
		if ch.ready[pod] {
			kinds = append(kinds, ChangeNotReady)
		}
	}
	if !ch.ready[pod] {
		kinds = append(kinds, ChangeReady)
	}
	if len(kinds) == 0 { // the only ready pod, and no room for another: one turns ready
		pod = names[slices.IndexFunc(names, func(n string) bool { return !ch.ready[n] })]
		kinds = []string{ChangeReady}
	}
	change := EndpointChange{At: time.Now(), Kind: kinds[ch.rnd.IntN(len(kinds))], Pod: pod}
	switch change.Kind {
	case ChangeAdd:
		name, err := ch.add(ctx)
		change.Pod = name
		return change, err
	case ChangeRemove:
		delete(ch.ready, pod)
		return change, ch.terminate(ctx, pod)
	default:
		ready := change.Kind == ChangeReady
		ch.ready[pod] = ready
		return change, ch.c.SetPodReady(ctx, pod, ready)
	}
}

// terminate deletes the pod as the API and a kubelet do with a grace
// period: the Pod object is marked deleted (the EndpointSlice controller
// turns its endpoint terminating), the pod serves out its grace, then the
// object and the pod are gone.
func (ch *Churn) terminate(ctx context.Context, name string) error {
	if ch.opts.Grace == 0 {
		return ch.c.RemovePod(ctx, name)
	}
	grace := int64(max(1, ch.opts.Grace/time.Second))
	if err := ch.c.Client.CoreV1().Pods(DefaultNamespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		return err
	}
	ch.ending.Add(1)
	go func() {
		defer ch.ending.Done()
		time.Sleep(ch.opts.Grace)
		_ = ch.c.RemovePod(context.Background(), name)
	}()
	return nil
}

// Stop waits for terminating pods to go and removes the others.
func (ch *Churn) Stop() {
	ch.ending.Wait()
	for name := range ch.ready {
		_ = ch.c.RemovePod(context.Background(), name)
	}
	ch.ready = map[string]bool{}
}
