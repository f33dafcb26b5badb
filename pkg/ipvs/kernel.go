package ipvs

import ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"

// The mode's view of the kernel is internal/ipvs's: its adapter, fake and
// the types they speak are defined there, below every mode, and named here
// as the mode's own so that its code and callers read as before.
type (
	Kernel           = ipvskernel.Interface
	VirtualServerKey = ipvskernel.VirtualServerKey
	VirtualServer    = ipvskernel.VirtualServer
	RealServer       = ipvskernel.RealServer
	SetType          = ipvskernel.SetType
	SetSpec          = ipvskernel.SetSpec
	SetChange        = ipvskernel.SetChange
)

const (
	DummyLink      = ipvskernel.DummyLink
	FlagPersistent = ipvskernel.FlagPersistent
	FlagHashed     = ipvskernel.FlagHashed
	FlagSourceHash = ipvskernel.FlagSourceHash
	HashIP         = ipvskernel.HashIP
	HashIPPort     = ipvskernel.HashIPPort
	HashIPPortIP   = ipvskernel.HashIPPortIP
	HashIPPortNet  = ipvskernel.HashIPPortNet
	BitmapPort     = ipvskernel.BitmapPort
	MaxSetEntries  = ipvskernel.MaxSetEntries
)
