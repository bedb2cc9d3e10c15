// cdi-admission serves CDI v1.65.0's own DataVolume admission webhooks to the lab's API server, as cdi-apiserver
// does in a cluster: the same handlers with the same clients, and the webhook registrations CDI's operator writes,
// pointed at this process by URL instead of a Service.
//
//	cdi-admission --kubeconfig FILE --listen 127.0.0.1:PORT --tls-cert F --tls-key F --ca-bundle F
//
// It installs what CDI's operator would and the handlers read (the CDIConfig, StorageProfile and DataSource CRDs,
// and a CDIConfig `config` with a fresh install's empty spec), then registers the webhooks once it can serve.
// GET /readyz answers 200 from then on.
package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"

	snapclient "github.com/kubernetes-csi/external-snapshotter/client/v6/clientset/versioned"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	extclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"kubevirt.io/containerized-data-importer/pkg/apiserver/webhooks"
	cdiclient "kubevirt.io/containerized-data-importer/pkg/client/clientset/versioned"
	"kubevirt.io/containerized-data-importer/pkg/operator/resources/cluster"
)

// The namespace a default install puts CDI in.
const installNamespace = "cdi"

// The webhook registrations served here, by the paths CDI's operator gives them.
const (
	validatePath = "/datavolume-validate"
	mutatePath   = "/datavolume-mutate"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of an identity that may install CRDs and webhooks")
	listen := flag.String("listen", "127.0.0.1:0", "address to serve HTTPS on")
	certFile := flag.String("tls-cert", "", "serving certificate (PEM)")
	keyFile := flag.String("tls-key", "", "serving key (PEM)")
	caFile := flag.String("ca-bundle", "", "CA that signed the serving certificate, given to the API server")
	flag.Parse()
	if *kubeconfig == "" || *certFile == "" || *keyFile == "" || *caFile == "" {
		fmt.Fprintln(os.Stderr, "cdi-admission: --kubeconfig, --tls-cert, --tls-key and --ca-bundle are required")
		os.Exit(2)
	}
	if err := run(*kubeconfig, *listen, *certFile, *keyFile, *caFile); err != nil {
		fmt.Fprintf(os.Stderr, "cdi-admission: %v\n", err)
		os.Exit(1)
	}
}

func run(kubeconfig, listen, certFile, keyFile, caFile string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	caBundle, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	// cdi-apiserver answers from informer caches, which no client-side rate limit slows; these reads go to the API
	// server instead, and client-go's default of 5 a second timed admission out under a thousand creates at once.
	cfg.QPS, cfg.Burst = 1000, 2000
	k8s, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cdi, err := cdiclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	snap, err := snapclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := cdiv1.AddToScheme(scheme); err != nil {
		return err
	}
	// cdi-apiserver reads some kinds through an informer cache; uncached reads answer the same, later by a moment.
	reader, err := crclient.New(cfg, crclient.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	exts, err := extclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := installAsOperatorWould(ctx, exts, cdi); err != nil {
		return err
	}
	// Signs the clone tokens the mutator adds to DataVolumes that clone; cdi-apiserver keeps its key in a Secret.
	signingKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}

	var ready atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not registered yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle(validatePath, webhooks.NewDataVolumeValidatingWebhook(k8s, cdi, snap, reader))
	mux.Handle(mutatePath, webhooks.NewDataVolumeMutatingWebhook(k8s, cdi, signingKey))

	server := &http.Server{
		Addr:              listen,
		Handler:           mux,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- server.ListenAndServeTLS("", "") }()

	base := "https://" + listen
	if err := register(ctx, k8s, base, caBundle); err != nil {
		return err
	}
	ready.Store(true)
	fmt.Fprintf(os.Stderr, "cdi-admission: serving CDI %s DataVolume admission at %s\n", cdiVersion(), base)

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return server.Shutdown(shutdown)
	}
}

// installAsOperatorWould creates the CRDs the handlers read (the lab installs DataVolumes' own) and the CDIConfig
// `config` whose feature gates they consult, with a fresh install's empty spec.
func installAsOperatorWould(ctx context.Context, exts extclient.Interface, cdi cdiclient.Interface) error {
	crds := exts.ApiextensionsV1().CustomResourceDefinitions()
	for _, crd := range []*extv1.CustomResourceDefinition{
		cluster.NewCdiConfigCrd(), cluster.NewStorageProfileCrd(), cluster.NewDataSourceCrd(),
	} {
		if _, err := crds.Create(ctx, crd, metav1.CreateOptions{}); err != nil && !k8serrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
		}
		if err := waitEstablished(ctx, exts, crd.Name); err != nil {
			return err
		}
	}
	config := &cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{Name: "config"}}
	// The CRD was just established; its REST endpoint may take a moment to serve.
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := cdi.CdiV1beta1().CDIConfigs().Create(ctx, config, metav1.CreateOptions{})
		if err == nil || k8serrors.IsAlreadyExists(err) {
			return true, nil
		}
		if k8serrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("creating the CDIConfig: %w", err)
	})
}

func waitEstablished(ctx context.Context, exts extclient.Interface, name string) error {
	crds := exts.ApiextensionsV1().CustomResourceDefinitions()
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		crd, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == extv1.Established && c.Status == extv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

// register writes CDI's operator's DataVolume webhook registrations, each pointed at this process by URL. Until
// then nothing is checked, so callers wait for /readyz.
func register(ctx context.Context, k8s kubernetes.Interface, base string, caBundle []byte) error {
	objects, err := cluster.CreateDynamicResourceGroup("apiserver-registrations", &cluster.FactoryArgs{Namespace: installNamespace})
	if err != nil {
		return err
	}
	pointAt := func(cfg *admissionregistrationv1.WebhookClientConfig) bool {
		if cfg.Service == nil || cfg.Service.Path == nil {
			return false
		}
		path := *cfg.Service.Path
		if path != validatePath && path != mutatePath {
			return false
		}
		url := base + path
		*cfg = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caBundle}
		return true
	}
	adm := k8s.AdmissionregistrationV1()
	registered := 0
	for _, object := range objects {
		switch o := object.(type) {
		case *admissionregistrationv1.ValidatingWebhookConfiguration:
			if len(o.Webhooks) != 1 || !pointAt(&o.Webhooks[0].ClientConfig) {
				continue
			}
			err = upsert(ctx, adm.ValidatingWebhookConfigurations(), o)
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			if len(o.Webhooks) != 1 || !pointAt(&o.Webhooks[0].ClientConfig) {
				continue
			}
			err = upsert(ctx, adm.MutatingWebhookConfigurations(), o)
		default:
			continue
		}
		if err != nil {
			return err
		}
		registered++
	}
	if registered != 2 {
		return fmt.Errorf("expected CDI's DataVolume validating and mutating webhooks, found %d", registered)
	}
	return nil
}

// typedClient is what client-go's typed clients offer for one kind.
type typedClient[T any] interface {
	Get(context.Context, string, metav1.GetOptions) (T, error)
	Create(context.Context, T, metav1.CreateOptions) (T, error)
	Update(context.Context, T, metav1.UpdateOptions) (T, error)
}

// upsert makes obj exist as given: created, or replaced over what a previous run left.
func upsert[T metav1.Object](ctx context.Context, c typedClient[T], obj T) error {
	existing, err := c.Get(ctx, obj.GetName(), metav1.GetOptions{})
	if k8serrors.IsNotFound(err) {
		_, err = c.Create(ctx, obj, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	obj.SetResourceVersion(existing.GetResourceVersion())
	_, err = c.Update(ctx, obj, metav1.UpdateOptions{})
	return err
}

// cdiVersion is the version of CDI's module compiled in.
func cdiVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "kubevirt.io/containerized-data-importer" {
				return dep.Version
			}
		}
	}
	return "(unknown)"
}
