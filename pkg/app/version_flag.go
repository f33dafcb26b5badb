package app

import "github.com/rapidproxy/rapidproxy/pkg/version"

// versionFlag is --version: bare or =true prints one line, =raw prints JSON,
// =false does nothing. Any other value is taken as a request to print it as
// the version, as upstream allows for testing.
type versionFlag struct {
	set   bool
	value string
}

func (v *versionFlag) String() string {
	if !v.set {
		return "false"
	}
	return v.value
}

func (v *versionFlag) Type() string { return "version" }

func (v *versionFlag) IsBoolFlag() bool { return true }

func (v *versionFlag) Set(s string) error {
	v.set, v.value = s != "false", s
	return nil
}

func (v *versionFlag) print(info version.Info) string {
	switch v.value {
	case "true":
		return info.String()
	case "raw":
		return info.JSON()
	default:
		info.GitVersion = v.value
		return info.String()
	}
}
