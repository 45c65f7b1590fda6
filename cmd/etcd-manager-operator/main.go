// Command etcd-manager-operator is the Kubernetes front end of etcd-manager:
// it runs EtcdCluster, EtcdBackup, EtcdBackupSchedule and EtcdRestore
// objects on the same engine as the agents on VMs.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/go-logr/logr"

	"github.com/etcd-manager/etcd-manager/cmd/internal/flags"
	"github.com/etcd-manager/etcd-manager/internal/cli"
	"github.com/etcd-manager/etcd-manager/internal/operator"
	"github.com/etcd-manager/etcd-manager/internal/version"
)

func main() {
	cfg := operator.Default()
	logCfg := cli.DefaultLogConfig()
	cmd := &cobra.Command{
		Use:     "etcd-manager-operator",
		Version: version.Get().String(),
		Short:   "Run etcd clusters on Kubernetes from EtcdCluster objects",
		Long: `etcd-manager-operator turns each EtcdCluster into a StatefulSet of etcd-manager
agents, Services and a PodDisruptionBudget, and writes the cluster spec to the
backup store, where the agents pick it up: they form, scale, heal, back up and
roll the cluster as they do on VMs. EtcdBackup, EtcdBackupSchedule and
EtcdRestore objects queue commands in the same store.

It reaches the store through the agents in the member pods, over their peer API
with mutual TLS and a certificate it issues itself from each cluster's CA
Secret: it holds no store credentials and needs no pods/exec. It uses
KUBECONFIG, or the in-cluster service account.`,
		Example:       "  etcd-manager-operator --image=registry.example/etcd-manager:v0.1",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			log, err := logCfg.NewLogger(os.Stderr)
			if err != nil {
				return err
			}
			ctrl.SetLogger(logr.FromSlogHandler(log.Handler()))
			restCfg, err := ctrl.GetConfig()
			if err != nil {
				return fmt.Errorf("no Kubernetes API to talk to: %w", err)
			}
			return operator.Run(ctrl.SetupSignalHandler(), cfg, restCfg)
		},
	}
	flags.Operator(cmd.Flags(), &cfg)
	flags.Log(cmd.Flags(), &logCfg)
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "etcd-manager-operator:", err)
		os.Exit(1)
	}
}
