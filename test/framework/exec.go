package framework

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
)

// run runs a command and returns its trimmed output, or an error that
// includes what it printed.
func run(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// runAll runs each command in turn, stopping at the first failure.
func runAll(cmds ...[]string) error {
	for _, c := range cmds {
		if _, err := run(c[0], c[1:]...); err != nil {
			return err
		}
	}
	return nil
}
