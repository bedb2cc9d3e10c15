// kubevirt-install installs KubeVirt v1.9.0's virt-controller and virt-handler on a cluster without virt-operator,
// rendering every object from virt-operator's own factories: the certificate authorities and the certificates
// signed by them (as the operator populates them), the CA bundle ConfigMaps, the priority class, the controller
// Deployment and the handler DaemonSet, with the images given. It then configures the KubeVirt CR that
// kubevirt-admission created (software emulation when asked, the pull policy) and sets its status phase to
// Deployed, as virt-operator does once it has installed: KubeVirt's components ignore a CR whose phase is empty.
//
//	kubevirt-install --kubeconfig FILE --controller-image I --handler-image I --launcher-image I [--emulation]
//	  [--seccomp-runtime-default] [--virt-type qemu]
//
// It is idempotent: objects that exist are left as they are, except the CR's configuration and status.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	v1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/kubecli"

	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
	operatorutil "kubevirt.io/kubevirt/pkg/virt-operator/util"
)

// How long the certificates live: the operator's default for its CAs (7 days) is short for a lab that may be kept
// for weeks, so one year.
const certificateDuration = 365 * 24 * time.Hour

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of a cluster administrator")
	namespace := flag.String("namespace", "kubevirt", "the namespace KubeVirt's CR and components live in")
	controllerImage := flag.String("controller-image", "", "virt-controller's image")
	handlerImage := flag.String("handler-image", "", "virt-handler's image")
	launcherImage := flag.String("launcher-image", "", "virt-launcher's image")
	emulation := flag.Bool("emulation", false, "run guests under software emulation (developerConfiguration.useEmulation)")
	seccomp := flag.Bool("seccomp-runtime-default", false, "give launcher pods the runtime's default seccomp profile (seccompConfiguration), which Pod Security's restricted level requires")
	virtType := flag.String("virt-type", "", "the node labeller's preferred virt type (PREFERRED_VIRTTYPE); empty keeps the factory's")
	flag.Parse()
	if *kubeconfig == "" || *controllerImage == "" || *handlerImage == "" || *launcherImage == "" {
		fmt.Fprintln(os.Stderr, "kubevirt-install: --kubeconfig and the three images are required")
		os.Exit(2)
	}
	if err := install(*kubeconfig, *namespace, *controllerImage, *handlerImage, *launcherImage, *emulation, *seccomp, *virtType); err != nil {
		fmt.Fprintf(os.Stderr, "kubevirt-install: %v\n", err)
		os.Exit(1)
	}
}

func install(kubeconfig, namespace, controllerImage, handlerImage, launcherImage string, emulation, seccompRuntimeDefault bool, virtType string) error {
	ctx := context.Background()
	client, err := kubecli.GetKubevirtClientFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	if err := crds(ctx, client); err != nil {
		return err
	}
	kv, err := configure(ctx, client, namespace, emulation, seccompRuntimeDefault)
	if err != nil {
		return err
	}
	if err := certificates(ctx, client, namespace); err != nil {
		return err
	}
	if _, err := client.SchedulingV1().PriorityClasses().Create(ctx, components.NewKubeVirtPriorityClassCR(), metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("creating the priority class: %w", err)
	}

	// The operator reads image names from its environment.
	for name, image := range map[string]string{
		operatorutil.VirtControllerImageEnvName: controllerImage,
		operatorutil.VirtHandlerImageEnvName:    handlerImage,
		operatorutil.VirtLauncherImageEnvName:   launcherImage,
	} {
		os.Setenv(name, image)
	}
	config := operatorutil.GetTargetConfigFromKV(kv)

	controller := components.NewControllerDeployment(config, "", "", "")
	// One replica: a single-node lab has room for one, and the factory's anti-affinity would leave a second pending.
	controller.Spec.Replicas = pointer(int32(1))
	// Leader election as a loaded cluster would tune it: on 2 cores with emulated guests booting, a lease renewal
	// took the API server more than the default 10 s now and then, and virt-controller exits when it loses the
	// lease (seen: CrashLoopBackOff, VMIs left in Scheduling for minutes).
	container := &controller.Spec.Template.Spec.Containers[0]
	container.Args = append(container.Args, "--leader-elect-lease-duration=60s", "--leader-elect-renew-deadline=45s")
	if _, err := client.AppsV1().Deployments(namespace).Create(ctx, controller, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("creating %s: %w", controller.Name, err)
	}

	handler := components.NewHandlerDaemonSet(config, "", "", "")
	if virtType != "" {
		setEnv(handler, "PREFERRED_VIRTTYPE", virtType)
	}
	if _, err := client.AppsV1().DaemonSets(namespace).Create(ctx, handler, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("creating %s: %w", handler.Name, err)
	}
	return nil
}

// crds creates every CRD virt-operator installs (virt-handler's and virt-controller's informers list them all); the
// ones kubevirt-admission or the lab created already are left as they are.
func crds(ctx context.Context, client kubecli.KubevirtClient) error {
	makers := []func() (*extv1.CustomResourceDefinition, error){
		components.NewVirtualMachineInstanceCrd, components.NewPresetCrd, components.NewReplicaSetCrd,
		components.NewVirtualMachineCrd, components.NewVirtualMachineInstanceMigrationCrd,
		components.NewVirtualMachineSnapshotCrd, components.NewVirtualMachineSnapshotContentCrd,
		components.NewVirtualMachineRestoreCrd, components.NewVirtualMachineInstancetypeCrd,
		components.NewVirtualMachineClusterInstancetypeCrd, components.NewVirtualMachinePoolCrd,
		components.NewMigrationPolicyCrd, components.NewVirtualMachinePreferenceCrd,
		components.NewVirtualMachineClusterPreferenceCrd, components.NewVirtualMachineExportCrd,
		components.NewVirtualMachineCloneCrd, components.NewVirtualMachineBackupCrd,
		components.NewVirtualMachineBackupTrackerCrd, components.NewPluginCrd,
	}
	api := client.ExtensionsClient().ApiextensionsV1().CustomResourceDefinitions()
	for _, newCrd := range makers {
		crd, err := newCrd()
		if err != nil {
			return err
		}
		if _, err := api.Create(ctx, crd, metav1.CreateOptions{}); ignoreExists(err) != nil {
			return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
		}
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			stored, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range stored.Status.Conditions {
				if c.Type == extv1.Established && c.Status == extv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s was not established: %w", crd.Name, err)
		}
	}
	return nil
}

// configure sets the CR's configuration and then its status phase, which makes the components read it.
func configure(ctx context.Context, client kubecli.KubevirtClient, namespace string, emulation, seccompRuntimeDefault bool) (*v1.KubeVirt, error) {
	kvs := client.KubeVirt(namespace)
	list, err := kvs.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing KubeVirt CRs: %w", err)
	}
	if len(list.Items) != 1 {
		return nil, fmt.Errorf("expected one KubeVirt CR in %s (kubevirt-admission creates it), found %d", namespace, len(list.Items))
	}
	kv := &list.Items[0]
	if kv.Spec.Configuration.DeveloperConfiguration == nil {
		kv.Spec.Configuration.DeveloperConfiguration = &v1.DeveloperConfiguration{}
	}
	kv.Spec.Configuration.DeveloperConfiguration.UseEmulation = emulation
	if seccompRuntimeDefault {
		kv.Spec.Configuration.SeccompConfiguration = &v1.SeccompConfiguration{
			VirtualMachineInstanceProfile: &v1.VirtualMachineInstanceProfile{
				CustomProfile: &v1.CustomProfile{RuntimeDefaultProfile: true},
			},
		}
	}
	kv.Spec.ImagePullPolicy = corev1.PullIfNotPresent
	if kv, err = kvs.Update(ctx, kv, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("configuring KubeVirt %s: %w", kv.Name, err)
	}
	// As virt-operator records them: without a default architecture virt-api's mutator leaves VMs' empty and
	// its validator refuses them ("unsupported architecture").
	operatorutil.SetDefaultArchitecture(kv)
	kv.Status.Phase = v1.KubeVirtPhaseDeployed
	kv.Status.ObservedKubeVirtVersion = "v1.9.0"
	kv.Status.TargetKubeVirtVersion = "v1.9.0"
	if kv, err = kvs.UpdateStatus(ctx, kv, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("setting KubeVirt's status phase: %w", err)
	}
	return kv, nil
}

// certificates creates the CAs, their bundles and the certificates they sign, as virt-operator populates them.
func certificates(ctx context.Context, client kubernetes.Interface, namespace string) error {
	duration := &metav1.Duration{Duration: certificateDuration}
	secrets := client.CoreV1().Secrets(namespace)
	cas := map[string]*corev1.Secret{}
	for _, secret := range components.NewCACertSecrets(namespace) {
		stored, err := createSecret(ctx, secrets, secret, nil, duration)
		if err != nil {
			return err
		}
		cas[secret.Name] = stored
	}
	for _, configMap := range components.NewCAConfigMaps(namespace) {
		bundle := ""
		if ca, ok := cas[configMap.Name]; ok {
			bundle = string(ca.Data[corev1.TLSCertKey])
		}
		configMap.Data = map[string]string{components.CABundleKey: bundle}
		if _, err := client.CoreV1().ConfigMaps(namespace).Create(ctx, configMap, metav1.CreateOptions{}); ignoreExists(err) != nil {
			return fmt.Errorf("creating ConfigMap %s: %w", configMap.Name, err)
		}
	}
	ca, err := components.LoadCertificates(cas[components.KubeVirtCASecretName])
	if err != nil {
		return fmt.Errorf("loading the KubeVirt CA: %w", err)
	}
	for _, secret := range components.NewCertSecrets(namespace, namespace) {
		if _, err := createSecret(ctx, secrets, secret, ca, duration); err != nil {
			return err
		}
	}
	return nil
}

type secretClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error)
	Create(ctx context.Context, secret *corev1.Secret, opts metav1.CreateOptions) (*corev1.Secret, error)
}

// createSecret populates and creates secret unless it exists; returns the stored one.
func createSecret(ctx context.Context, secrets secretClient, secret *corev1.Secret, ca *tls.Certificate, duration *metav1.Duration) (*corev1.Secret, error) {
	if stored, err := secrets.Get(ctx, secret.Name, metav1.GetOptions{}); err == nil {
		return stored, nil
	} else if !k8serrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading Secret %s: %w", secret.Name, err)
	}
	if err := components.PopulateSecretWithCertificate(secret, ca, duration); err != nil {
		return nil, fmt.Errorf("populating Secret %s: %w", secret.Name, err)
	}
	stored, err := secrets.Create(ctx, secret, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating Secret %s: %w", secret.Name, err)
	}
	return stored, nil
}

func setEnv(ds *appsv1.DaemonSet, name, value string) {
	for i := range ds.Spec.Template.Spec.InitContainers {
		c := &ds.Spec.Template.Spec.InitContainers[i]
		for j := range c.Env {
			if c.Env[j].Name == name {
				c.Env[j].Value = value
			}
		}
	}
}

func ignoreExists(err error) error {
	if k8serrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

func pointer[T any](v T) *T { return &v }
