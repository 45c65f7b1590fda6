package operator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
	"github.com/etcd-manager/etcd-manager/internal/spec"
)

// Config is the operator's configuration.
type Config struct {
	// Image is the image of member pods whose EtcdCluster names none;
	// empty means the operator's own, read from its pod.
	Image string
	// ImageVersions are the etcd versions Image carries; empty means the
	// versions recorded in the operator's own image (ImageVersionsFile),
	// when member pods run that image. A cluster whose versions the image
	// lacks is held (Degraded, reason ImageLacksVersion).
	ImageVersions []string
	// Namespaces limit the operator to these namespaces; none watches all.
	Namespaces []string
	// ClusterDomain is the Kubernetes cluster's DNS domain, for the
	// Service names in the members' certificates.
	ClusterDomain string
	// LeaderElection makes one of several replicas act.
	LeaderElection          bool
	LeaderElectionNamespace string
	// LeaderElectionID names the Lease: two installs in one namespace
	// need two.
	LeaderElectionID string
	// MetricsAddress and HealthAddress serve /metrics and /healthz,
	// /readyz ("0" turns them off).
	MetricsAddress string
	HealthAddress  string
}

// Default returns the defaults.
func Default() Config {
	return Config{ClusterDomain: DefaultClusterDomain, LeaderElection: true, LeaderElectionID: "etcd-manager-operator.etcd-manager.dev", MetricsAddress: ":8080", HealthAddress: ":8081"}
}

// The environment that names the operator's own pod (from the downward
// API), whose image member pods run unless --image says otherwise.
const (
	EnvPodName      = "POD_NAME"
	EnvPodNamespace = "POD_NAMESPACE"
)

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	for _, ns := range c.Namespaces {
		if bad := validation.IsDNS1123Label(ns); len(bad) > 0 {
			errs = append(errs, fmt.Errorf("--namespaces: %q is not a namespace name: %s", ns, strings.Join(bad, "; ")))
		}
	}
	if bad := validation.IsDNS1123Subdomain(c.ClusterDomain); len(bad) > 0 {
		errs = append(errs, fmt.Errorf("--cluster-domain %q is not a DNS domain: %s", c.ClusterDomain, strings.Join(bad, "; ")))
	}
	for _, v := range c.ImageVersions {
		if _, err := spec.ParseVersion(v); err != nil {
			errs = append(errs, fmt.Errorf("--image-etcd-versions: %w", err))
		}
	}
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
		LeaderElectionID:        cfg.LeaderElectionID,
		LeaderElectionNamespace: cfg.LeaderElectionNamespace,
	}
	if len(cfg.Namespaces) > 0 {
		opts.Cache.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range cfg.Namespaces {
			opts.Cache.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	mgr, err := ctrl.NewManager(restCfg, opts)
	if err != nil {
		return nil, fmt.Errorf("operator: manager: %w", err)
	}
	kc, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("operator: client: %w", err)
	}
	versions := cfg.ImageVersions
	if cfg.Image == "" {
		if cfg.Image, err = OwnImage(context.Background(), kc, os.Getenv(EnvPodNamespace), os.Getenv(EnvPodName)); err != nil {
			return nil, err
		}
		if len(versions) == 0 {
			if versions, err = ReadImageVersions(ImageVersionsFile); err != nil {
				return nil, err
			}
		}
	}
	lg := ctrl.Log.WithName("setup")
	if len(versions) == 0 {
		lg.Info("the etcd versions of the member image are not known: clusters are rolled to it unchecked; set --image-etcd-versions", "image", cfg.Image)
	} else {
		lg.Info("member image", "image", cfg.Image, "etcd-versions", strings.Join(versions, ","))
	}
	engine := &Agents{Client: mgr.GetClient()}
	rec := mgr.GetEventRecorder(managerName)
	for _, r := range []interface{ SetupWithManager(ctrl.Manager) error }{
		&ClusterReconciler{Client: mgr.GetClient(), Engine: engine, Events: rec, Image: cfg.Image, ImageVersions: versions, ClusterDomain: cfg.ClusterDomain},
		&BackupReconciler{Client: mgr.GetClient(), Engine: engine, Events: rec},
		&RestoreReconciler{Client: mgr.GetClient(), Engine: engine, Events: rec},
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

// ImageVersionsFile is where the image (hack/image) records the etcd
// versions it carries, comma separated: the operator reads its own.
const ImageVersionsFile = "/etc/etcd-manager/etcd-versions"

// ReadImageVersions reads the etcd versions recorded at path; none, with
// no error, when there is no such file (an operator run outside its
// image).
func ReadImageVersions(path string) ([]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("operator: the image's etcd versions: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4<<10))
	if err != nil {
		return nil, fmt.Errorf("operator: the image's etcd versions: %w", err)
	}
	var out []string
	for _, v := range strings.FieldsFunc(string(b), func(r rune) bool { return r == ',' || r == '\n' || r == ' ' }) {
		if _, err := spec.ParseVersion(v); err != nil {
			return nil, fmt.Errorf("operator: the image's etcd versions in %s: %w", path, err)
		}
		out = append(out, v)
	}
	return out, nil
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
