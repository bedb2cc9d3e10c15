// kubevirt-admission serves KubeVirt v1.9.0's own admission webhooks for VirtualMachines and
// VirtualMachineInstances to the lab's API server, as virt-api does in a cluster: the same handlers, the same
// informers and cluster configuration, and the webhook registrations virt-operator writes, pointed at this process
// by URL instead of a Service.
//
//	kubevirt-admission --kubeconfig FILE --listen 127.0.0.1:PORT --tls-cert F --tls-key F --ca-bundle F
//
// It installs the CRDs virt-api's informers list (KubeVirt, presets, restores, backups) and a KubeVirt CR with the
// empty configuration of a fresh install, as virt-operator would, then registers the webhooks once it can serve.
// GET /readyz answers 200 from then on.
package main

import (
	"context"
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

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"

	v1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/kubecli"
	"kubevirt.io/client-go/log"

	"kubevirt.io/kubevirt/pkg/controller"
	netadmitter "kubevirt.io/kubevirt/pkg/network/admitter"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks"
	mutating "kubevirt.io/kubevirt/pkg/virt-api/webhooks/mutating-webhook"
	validating "kubevirt.io/kubevirt/pkg/virt-api/webhooks/validating-webhook"
	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/rbac"
)

// The namespace a default install puts KubeVirt in; its ServiceAccounts are the ones the webhooks trust.
const installNamespace = "kubevirt"

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of an identity that may install CRDs and webhooks")
	listen := flag.String("listen", "127.0.0.1:0", "address to serve HTTPS on")
	certFile := flag.String("tls-cert", "", "serving certificate (PEM)")
	keyFile := flag.String("tls-key", "", "serving key (PEM)")
	caFile := flag.String("ca-bundle", "", "CA that signed the serving certificate, given to the API server")
	flag.Parse()
	if *kubeconfig == "" || *certFile == "" || *keyFile == "" || *caFile == "" {
		fmt.Fprintln(os.Stderr, "kubevirt-admission: --kubeconfig, --tls-cert, --tls-key and --ca-bundle are required")
		os.Exit(2)
	}
	log.InitializeLogging("kubevirt-admission")
	if err := run(*kubeconfig, *listen, *certFile, *keyFile, *caFile); err != nil {
		fmt.Fprintf(os.Stderr, "kubevirt-admission: %v\n", err)
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
	virtCli, err := kubecli.GetKubevirtClientFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	if err := installAsOperatorWould(ctx, virtCli); err != nil {
		return err
	}
	if err := installRBAC(ctx, virtCli); err != nil {
		return err
	}

	clusterConfig, informers, err := startInformers(ctx, virtCli)
	if err != nil {
		return err
	}
	serviceAccounts := webhooks.KubeVirtServiceAccounts(installNamespace)

	var ready atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not registered yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// The five handlers virt-api registers for VMs and VMIs, with the arguments it gives them.
	mux.HandleFunc(components.VMMutatePath, func(w http.ResponseWriter, r *http.Request) {
		mutating.ServeVMs(w, r, clusterConfig, virtCli)
	})
	mux.HandleFunc(components.VMIMutatePath, func(w http.ResponseWriter, r *http.Request) {
		mutating.ServeVMIs(w, r, clusterConfig, informers, serviceAccounts)
	})
	mux.HandleFunc(components.VMValidatePath, func(w http.ResponseWriter, r *http.Request) {
		validating.ServeVMs(w, r, clusterConfig, virtCli, informers, serviceAccounts)
	})
	mux.HandleFunc(components.VMICreateValidatePath, func(w http.ResponseWriter, r *http.Request) {
		validating.ServeVMICreate(w, r, clusterConfig, serviceAccounts,
			func(p *field.Path, spec *v1.VirtualMachineInstanceSpec, cfg *virtconfig.ClusterConfig) []metav1.StatusCause {
				return netadmitter.Validate(p, spec, cfg)
			})
	})
	mux.HandleFunc(components.VMIUpdateValidatePath, func(w http.ResponseWriter, r *http.Request) {
		validating.ServeVMIUpdate(w, r, clusterConfig, serviceAccounts)
	})

	server := &http.Server{
		Addr:              listen,
		Handler:           mux,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- server.ListenAndServeTLS("", "") }()

	base := "https://" + listen
	if err := register(ctx, virtCli, base, caBundle); err != nil {
		return err
	}
	ready.Store(true)
	fmt.Fprintf(os.Stderr, "kubevirt-admission: serving KubeVirt %s admission at %s\n", kubevirtVersion(), base)

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return server.Shutdown(shutdown)
	}
}

// installAsOperatorWould creates what virt-operator installs and virt-api's informers list: the CRDs, the install
// namespace, and a KubeVirt CR with an empty configuration (a fresh install's defaults).
func installAsOperatorWould(ctx context.Context, virtCli kubecli.KubevirtClient) error {
	makers := []func() (*extv1.CustomResourceDefinition, error){
		components.NewKubeVirtCrd,
		components.NewPresetCrd,
		components.NewVirtualMachineRestoreCrd,
		components.NewVirtualMachineBackupCrd,
		components.NewVirtualMachineInstancetypeCrd,
		components.NewVirtualMachineClusterInstancetypeCrd,
		components.NewVirtualMachinePreferenceCrd,
		components.NewVirtualMachineClusterPreferenceCrd,
	}
	crds := virtCli.ExtensionsClient().ApiextensionsV1().CustomResourceDefinitions()
	for _, newCrd := range makers {
		crd, err := newCrd()
		if err != nil {
			return err
		}
		if _, err := crds.Create(ctx, crd, metav1.CreateOptions{}); err != nil && !k8serrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
		}
		if err := waitEstablished(ctx, virtCli, crd.Name); err != nil {
			return err
		}
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: installNamespace}}
	if _, err := virtCli.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !k8serrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", installNamespace, err)
	}
	kv := &v1.KubeVirt{
		ObjectMeta: metav1.ObjectMeta{Name: "kubevirt", Namespace: installNamespace},
		Spec:       v1.KubeVirtSpec{Configuration: v1.KubeVirtConfiguration{}},
	}
	// The CRD was just established; its REST endpoint may take a moment to serve.
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := virtCli.KubeVirt(installNamespace).Create(ctx, kv, metav1.CreateOptions{})
		if err == nil || k8serrors.IsAlreadyExists(err) {
			return true, nil
		}
		if k8serrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("creating the KubeVirt CR: %w", err)
	})
}

func waitEstablished(ctx context.Context, virtCli kubecli.KubevirtClient, name string) error {
	crds := virtCli.ExtensionsClient().ApiextensionsV1().CustomResourceDefinitions()
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

// startInformers builds the informers and cluster configuration virt-api builds, and waits for their caches.
func startInformers(ctx context.Context, virtCli kubecli.KubevirtClient) (*virtconfig.ClusterConfig, *webhooks.Informers, error) {
	factory := controller.NewKubeInformerFactory(virtCli.RestClient(), virtCli, virtCli, nil, installNamespace)
	kubeVirt := factory.KubeVirt()
	crds := factory.CRD()
	informers := &webhooks.Informers{
		VMIPresetInformer: factory.VirtualMachinePreset(),
		VMRestoreInformer: factory.VirtualMachineRestore(),
		VMBackupInformer:  factory.VirtualMachineBackup(),
		NamespaceInformer: factory.Namespace(),
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	clusterConfig, err := virtconfig.NewClusterConfig(crds, kubeVirt, installNamespace)
	if err != nil {
		return nil, nil, err
	}
	// As virt-api: DataSources are watched only where CDI serves them.
	if clusterConfig.HasDataSourceAPI() {
		informers.DataSourceInformer = factory.DataSource()
	} else {
		informers.DataSourceInformer = factory.DummyDataSource()
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informers.DataSourceInformer.HasSynced) {
		return nil, nil, fmt.Errorf("DataSource cache did not sync")
	}
	return clusterConfig, informers, nil
}

// register writes virt-operator's webhook registrations, keeping the webhooks this process serves, each pointed at
// it by URL. Until then nothing is checked, so callers wait for /readyz.
func register(ctx context.Context, virtCli kubecli.KubevirtClient, base string, caBundle []byte) error {
	served := map[string]bool{
		components.VMMutatePath: true, components.VMIMutatePath: true, components.VMValidatePath: true,
		components.VMICreateValidatePath: true, components.VMIUpdateValidatePath: true,
	}
	pointAt := func(cfg *admissionregistrationv1.WebhookClientConfig) bool {
		if cfg.Service == nil || cfg.Service.Path == nil || !served[*cfg.Service.Path] {
			return false
		}
		url := base + *cfg.Service.Path
		*cfg = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caBundle}
		return true
	}

	mutatingCfg := components.NewVirtAPIMutatingWebhookConfiguration(installNamespace)
	mutatingCfg.Webhooks = keepServed(mutatingCfg.Webhooks,
		func(w *admissionregistrationv1.MutatingWebhook) *admissionregistrationv1.WebhookClientConfig { return &w.ClientConfig },
		pointAt)
	validatingCfg := components.NewVirtAPIValidatingWebhookConfiguration(installNamespace)
	validatingCfg.Webhooks = keepServed(validatingCfg.Webhooks,
		func(w *admissionregistrationv1.ValidatingWebhook) *admissionregistrationv1.WebhookClientConfig { return &w.ClientConfig },
		pointAt)

	if len(mutatingCfg.Webhooks) != 2 || len(validatingCfg.Webhooks) != 3 {
		return fmt.Errorf("expected 2 mutating and 3 validating webhooks for VMs and VMIs, found %d and %d",
			len(mutatingCfg.Webhooks), len(validatingCfg.Webhooks))
	}

	adm := virtCli.AdmissionregistrationV1()
	if err := upsert(ctx, adm.MutatingWebhookConfigurations(), mutatingCfg); err != nil {
		return err
	}
	return upsert(ctx, adm.ValidatingWebhookConfigurations(), validatingCfg)
}

// keepServed keeps the webhooks this process serves, each pointed at it.
func keepServed[W any](webhooks []W, clientConfig func(*W) *admissionregistrationv1.WebhookClientConfig, pointAt func(*admissionregistrationv1.WebhookClientConfig) bool) []W {
	kept := webhooks[:0]
	for i := range webhooks {
		if pointAt(clientConfig(&webhooks[i])) {
			kept = append(kept, webhooks[i])
		}
	}
	return kept
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

// installRBAC gives virt-controller's and virt-handler's ServiceAccounts their roles, as virt-operator does: the
// lab's KubeVirt stand-in acts as them, and what those roles do not allow is refused to it as to KubeVirt.
func installRBAC(ctx context.Context, virtCli kubecli.KubevirtClient) error {
	objects := append(rbac.GetAllController(installNamespace, false), rbac.GetAllHandler(installNamespace)...)
	for _, object := range objects {
		var err error
		switch o := object.(type) {
		case *corev1.ServiceAccount:
			err = upsert(ctx, virtCli.CoreV1().ServiceAccounts(o.Namespace), o)
		case *rbacv1.Role:
			err = upsert(ctx, virtCli.RbacV1().Roles(o.Namespace), o)
		case *rbacv1.RoleBinding:
			err = upsert(ctx, virtCli.RbacV1().RoleBindings(o.Namespace), o)
		case *rbacv1.ClusterRole:
			err = upsert(ctx, virtCli.RbacV1().ClusterRoles(), o)
		case *rbacv1.ClusterRoleBinding:
			err = upsert(ctx, virtCli.RbacV1().ClusterRoleBindings(), o)
		default:
			err = fmt.Errorf("unexpected %T", object)
		}
		if err != nil {
			return fmt.Errorf("installing KubeVirt's RBAC: %w", err)
		}
	}
	return nil
}

// kubevirtVersion is the version of KubeVirt's module compiled in.
func kubevirtVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "kubevirt.io/kubevirt" {
				return dep.Version
			}
		}
	}
	return "(unknown)"
}
