// Package app is the kube-proxy command: flags, configuration and start-up.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation/field"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"

	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/pkg/server"
	"github.com/rapidproxy/rapidproxy/pkg/version"
)

// configPollInterval is how often the config file is checked for changes
// where inotify is not to be had.
const configPollInterval = time.Second

// Run runs the kube-proxy command with the given arguments and returns the
// process exit code. SIGINT and SIGTERM stop it cleanly.
func Run(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return run(ctx, args, os.Stdout, os.Stderr)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := newCommand()
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "kube-proxy: %v\n", err)
		return 1
	}
	return 0
}

func newCommand() *cobra.Command {
	o := newOptions()
	cmd := &cobra.Command{
		Use:   "kube-proxy",
		Short: "rapidproxy: a drop-in replacement for the Kubernetes network proxy",
		Long: `kube-proxy runs on each node. It watches Services and EndpointSlices and programs the
node's kernel (iptables or IPVS) so that traffic to a Service reaches one of its endpoints.
This is rapidproxy, which accepts upstream kube-proxy's flags and configuration file unchanged.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("kube-proxy takes no positional arguments, got %q", args)
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), cmd.Flags(), cmd.OutOrStdout())
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return fmt.Errorf("%w (see kube-proxy --help)", err)
	})
	o.addFlags(cmd.Flags())
	return cmd
}

func (o *options) run(ctx context.Context, fs *pflag.FlagSet, stdout io.Writer) error {
	if o.version.set {
		fmt.Fprintln(stdout, o.version.print(version.Get()))
		return nil
	}
	if err := o.complete(fs); err != nil {
		return err
	}
	if errs := config.Validate(o.cfg); len(errs) > 0 {
		return invalidConfig(o.configFile, errs)
	}
	if o.writeConfigTo != "" {
		if err := config.Write(o.cfg, o.writeConfigTo); err != nil {
			return fmt.Errorf("writing the configuration: %w", err)
		}
		fmt.Fprintf(stdout, "Wrote configuration to %s\n", o.writeConfigTo)
		return nil
	}
	if err := applyLogging(o.cfg); err != nil {
		return err
	}
	switch {
	case o.cleanup:
		return server.Cleanup(ctx, o.cfg)
	case o.initOnly:
		return server.InitOnly(ctx, o.cfg, o.modeDefaulted)
	}
	return o.serve(ctx, flagValues(fs))
}

// flagValues are every flag's name and value, for /flagz.
func flagValues(fs *pflag.FlagSet) map[string]string {
	out := map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) { out[f.Name] = f.Value.String() })
	return out
}

// complete builds the configuration in force: the file when --config is
// given (with only the logging flags and --hostname-override on top, as
// upstream), else the flags over the defaults.
func (o *options) complete(fs *pflag.FlagSet) error {
	if o.configFile != "" {
		cfg, modeDefaulted, err := config.LoadFile(o.configFile)
		if err != nil {
			return err
		}
		o.modeDefaulted = modeDefaulted
		if err := copyChangedLoggingFlags(fs, cfg); err != nil {
			return err
		}
		o.cfg = cfg
	} else {
		o.modeDefaulted = !fs.Changed("proxy-mode") || o.cfg.Mode == ""
		o.applyModeFlags(fs)
		config.Default(o.cfg)
	}
	if fs.Changed("hostname-override") {
		name := strings.TrimSpace(o.hostnameOverride)
		if name == "" {
			return errors.New("--hostname-override: an empty hostname is invalid")
		}
		o.cfg.HostnameOverride = strings.ToLower(name)
	}
	return nil
}

// serve runs the proxy until the context ends, it fails, or the config
// file changes (the process exits so its supervisor restarts it with the
// new file, as upstream does).
func (o *options) serve(ctx context.Context, flags map[string]string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errCh := make(chan error, 2)
	if o.configFile != "" {
		watch, err := watchFile(o.configFile)
		if err != nil {
			return err
		}
		go func() { errCh <- watch.wait(ctx, configPollInterval) }()
	}
	go func() {
		errCh <- server.Run(ctx, o.cfg, server.Options{Master: o.master, Flags: flags, ModeDefaulted: o.modeDefaulted})
	}()
	err := <-errCh
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// applyLogging makes the configured log format and verbosity take effect.
func applyLogging(cfg *config.Config) error {
	gate := config.NewFeatureGate()
	if err := gate.SetFromMap(cfg.FeatureGates); err != nil {
		return err
	}
	if err := logsapi.ValidateAndApply(&cfg.Logging, gate); err != nil {
		return fmt.Errorf("logging: %w", err)
	}
	klog.InfoS("Starting kube-proxy", "version", version.Get().String(), "mode", cfg.Mode)
	return nil
}

// invalidConfig reports every validation error, one per line.
func invalidConfig(file string, errs field.ErrorList) error {
	where := "the command line"
	if file != "" {
		where = "config file " + file
	}
	lines := make([]string, len(errs))
	for i, e := range errs {
		lines[i] = "  " + e.Error()
	}
	return fmt.Errorf("invalid configuration in %s:\n%s", where, strings.Join(lines, "\n"))
}
