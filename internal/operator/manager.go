package operator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
)

// Config is the operator's configuration.
type Config struct {
	// Image is the image of member pods whose EtcdCluster names none;
	// empty means the operator's own, read from its pod.
	Image string
	// Namespace limits the operator to one namespace; empty watches all.
	Namespace string
	// LeaderElection makes one of several replicas act.
	LeaderElection          bool
	LeaderElectionNamespace string
	// MetricsAddress and HealthAddress serve /metrics and /healthz,
	// /readyz ("0" turns them off).
	MetricsAddress string
	HealthAddress  string
}

// Default returns the defaults.
func Default() Config {
	return Config{LeaderElection: true, MetricsAddress: ":8080", HealthAddress: ":8081"}
}

// The environment that names the operator's own pod (from the downward
// API), whose image member pods run unless --image says otherwise.
const (
	EnvPodName      = "POD_NAME"
	EnvPodNamespace = "POD_NAMESPACE"
)

// AddFlags registers the operator's flags.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Image, "image", c.Image, "image of the member pods of an EtcdCluster that sets no spec.image (default: the operator's own, read from its pod, named by $POD_NAMESPACE and $POD_NAME)")
	fs.StringVar(&c.Namespace, "namespace", c.Namespace, "watch only this namespace (default: all)")
	fs.BoolVar(&c.LeaderElection, "leader-elect", c.LeaderElection, "elect one active operator among replicas with a Lease")
	fs.StringVar(&c.LeaderElectionNamespace, "leader-election-namespace", c.LeaderElectionNamespace, "namespace of the leader election Lease (default: the operator's own, from the service account)")
	fs.StringVar(&c.MetricsAddress, "metrics-address", c.MetricsAddress, "host:port for Prometheus metrics at /metrics (0 turns them off)")
	fs.StringVar(&c.HealthAddress, "health-address", c.HealthAddress, "host:port for /healthz and /readyz (0 turns them off)")
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	for name, addr := range map[string]string{"--metrics-address": c.MetricsAddress, "--health-address": c.HealthAddress} {
		if addr == "0" {
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want host:port or 0", name, addr))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("operator: invalid configuration: %w", errors.Join(errs...))
	}
	return nil
}

// Scheme holds the API types the operator uses.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// ClientOptions keep Secrets out of the manager's cache: the operator reads
// one CA Secret now and then, and needs no list or watch on every Secret.
func ClientOptions() client.Options {
	return client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}}
}

// NewManager returns a manager running every reconciler of the operator.
func NewManager(cfg Config, restCfg *rest.Config) (ctrl.Manager, error) {
	s, err := Scheme()
	if err != nil {
		return nil, err
	}
	opts := ctrl.Options{
		Scheme:                  s,
		Client:                  ClientOptions(),
		Metrics:                 metricsserver.Options{BindAddress: cfg.MetricsAddress},
		HealthProbeBindAddress:  cfg.HealthAddress,
		LeaderElection:          cfg.LeaderElection,
		LeaderElectionID:        "etcd-manager-operator.etcd-manager.dev",
		LeaderElectionNamespace: cfg.LeaderElectionNamespace,
	}
	if cfg.Namespace != "" {
		opts.Cache.DefaultNamespaces = map[string]cache.Config{cfg.Namespace: {}}
	}
	mgr, err := ctrl.NewManager(restCfg, opts)
	if err != nil {
		return nil, fmt.Errorf("operator: manager: %w", err)
	}
	kc, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("operator: client: %w", err)
	}
	if cfg.Image == "" {
		if cfg.Image, err = OwnImage(context.Background(), kc, os.Getenv(EnvPodNamespace), os.Getenv(EnvPodName)); err != nil {
			return nil, err
		}
	}
	ctl := Ctl{Exec: PodExec{Config: restCfg, Client: kc}}
	rec := mgr.GetEventRecorder(managerName)
	for _, r := range []interface{ SetupWithManager(ctrl.Manager) error }{
		&ClusterReconciler{Client: mgr.GetClient(), Ctl: ctl, Events: rec, Image: cfg.Image},
		&BackupReconciler{Client: mgr.GetClient(), Ctl: ctl, Events: rec},
		&RestoreReconciler{Client: mgr.GetClient(), Ctl: ctl, Events: rec},
		&ScheduleReconciler{Client: mgr.GetClient()},
	} {
		if err := r.SetupWithManager(mgr); err != nil {
			return nil, fmt.Errorf("operator: %w", err)
		}
	}
	if cfg.HealthAddress != "0" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return nil, err
		}
		if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// OwnImage is the image of the operator's container in its own pod: member
// pods run it, so that one image tag, set once (kustomize's images, Helm's
// image), names both.
func OwnImage(ctx context.Context, kc kubernetes.Interface, namespace, name string) (string, error) {
	if namespace == "" || name == "" {
		return "", fmt.Errorf("operator: --image is not set, and $%s and $%s do not name the operator's pod to read its image from (the shipped Deployment sets them)", EnvPodNamespace, EnvPodName)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pod, err := kc.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("operator: --image is not set, and the operator's own pod %s/%s cannot be read: %w", namespace, name, err)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == operatorContainer || len(pod.Spec.Containers) == 1 {
			return c.Image, nil
		}
	}
	return "", fmt.Errorf("operator: --image is not set, and pod %s/%s has no container %q", namespace, name, operatorContainer)
}

// operatorContainer is the operator's container in its Deployment.
const operatorContainer = "operator"

// Run runs the operator until ctx ends.
func Run(ctx context.Context, cfg Config, restCfg *rest.Config) error {
	mgr, err := NewManager(cfg, restCfg)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}
