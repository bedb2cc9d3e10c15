// cdi-install installs CDI v1.65.0's controller into a cluster as CDI's operator would, from the operator's own
// resource factories, so that the real cdi-controller (built from the same module, see README.md) can run as a pod:
//
//	cdi-install --kubeconfig FILE --controller-image IMAGE --importer-image IMAGE [--namespace cdi]
//
// It creates, or replaces with CDI's own, every CRD CDI defines (the `cdi` one included); the controller's RBAC and
// the aggregated roles; the `CDI` CR and the CDIConfig feature gates of CDI's release CR; the clone-token signing key
// and the upload signers the controller reads at start (as cdi-apiserver and the operator's certificate rotation
// would); and the controller's ServiceAccount, Role, Deployment and metrics Service. Neither cdi-apiserver nor
// cdi-uploadproxy is installed: the lab serves cdi-apiserver's DataVolume webhooks itself (tools/cdi-admission), and
// uploads are not used. Run again, it replaces what it installed.
package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"flag"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	featuregates "kubevirt.io/containerized-data-importer/pkg/feature-gates"
	"kubevirt.io/containerized-data-importer/pkg/keys"
	"kubevirt.io/containerized-data-importer/pkg/operator/resources"
	"kubevirt.io/containerized-data-importer/pkg/operator/resources/cert"
	"kubevirt.io/containerized-data-importer/pkg/operator/resources/cluster"
	"kubevirt.io/containerized-data-importer/pkg/operator/resources/namespaced"
	sdkapi "kubevirt.io/controller-lifecycle-operator-sdk/api"
)

// The version the factories stamp on what they make, as the operator passes its own.
const version = "v1.65.0"

// The feature gates of CDI's release CR (manifests/templates/release/cdi-cr.yaml.in).
var releaseGates = []string{featuregates.HonorWaitForFirstConsumer, featuregates.WebhookPvcRendering}

// The cluster-wide groups the controller needs; the apiserver's, uploadproxy's and cronjob's are left out with them.
var clusterGroups = []string{"crd-resources", "controller-rbac", "aggregate-roles"}

// The signers the controller reads at start (cmd/cdi-controller: its upload server and client CAs and bundles).
var controllerSigners = map[string]bool{"cdi-uploadserver-signer": true, "cdi-uploadserver-client-signer": true}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of an identity that may install CRDs and RBAC")
	namespace := flag.String("namespace", "cdi", "namespace of CDI's controller")
	controllerImage := flag.String("controller-image", "", "image with /usr/bin/cdi-controller")
	importerImage := flag.String("importer-image", "", "image with /usr/bin/cdi-importer")
	pullPolicy := flag.String("pull-policy", string(corev1.PullIfNotPresent), "pull policy of CDI's pods")
	verbosity := flag.String("verbosity", "1", "the controller's and its pods' klog verbosity")
	flag.Parse()
	if *kubeconfig == "" || *controllerImage == "" || *importerImage == "" {
		fmt.Fprintln(os.Stderr, "cdi-install: --kubeconfig, --controller-image and --importer-image are required")
		os.Exit(2)
	}
	args := &namespaced.FactoryArgs{
		OperatorVersion:        version,
		ControllerImage:        *controllerImage,
		DeployClusterResources: "true",
		ImporterImage:          *importerImage,
		// Required by the controller; never run, since nothing here clones, uploads or reads oVirt.
		ClonerImage:         "cdi-cloner:not-installed",
		OvirtPopulatorImage: "ovirt-populator:not-installed",
		APIServerImage:      "cdi-apiserver:not-installed",
		UploadProxyImage:    "cdi-uploadproxy:not-installed",
		UploadServerImage:   "cdi-uploadserver:not-installed",
		Verbosity:           *verbosity,
		PullPolicy:          *pullPolicy,
		Namespace:           *namespace,
		ControllerReplicas:  1,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := install(ctx, *kubeconfig, args); err != nil {
		fmt.Fprintf(os.Stderr, "cdi-install: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "cdi-install: CDI %s's controller installed in %s\n", version, *namespace)
}

func install(ctx context.Context, kubeconfig string, args *namespaced.FactoryArgs) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, extv1.AddToScheme, cdiv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	c, err := crclient.New(cfg, crclient.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	k8s, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ns := args.Namespace

	if err := apply(ctx, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}
	crds, err := clusterObjects(ns)
	if err != nil {
		return err
	}
	if err := applyAll(ctx, c, crds); err != nil {
		return err
	}
	for _, o := range crds {
		if crd, ok := o.(*extv1.CustomResourceDefinition); ok {
			if err := waitEstablished(ctx, c, crd.Name); err != nil {
				return err
			}
		}
	}
	if err := apply(ctx, c, releaseCR()); err != nil {
		return err
	}
	if err := setGates(ctx, c); err != nil {
		return err
	}
	// The clone-token key cdi-apiserver makes at start, by its own function; the controller reads it from files.
	if _, err := keys.GetOrCreatePrivateKey(k8s, ns, "cdi-api-signing-key", nil); err != nil {
		return fmt.Errorf("the signing key: %w", err)
	}
	signers, err := signerObjects(ns)
	if err != nil {
		return err
	}
	if err := applyAll(ctx, c, signers); err != nil {
		return err
	}
	controller, err := namespaced.CreateResourceGroup("controller", args)
	if err != nil {
		return err
	}
	return applyAll(ctx, c, controller)
}

// clusterObjects: every CRD CDI defines (the factories' and the `cdi` CRD the operator installs from its generated
// YAML), then the controller's cluster roles and the aggregated ones.
func clusterObjects(ns string) ([]crclient.Object, error) {
	cdiCRD := &extv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal([]byte(resources.CDICRDs["cdi"]), cdiCRD); err != nil {
		return nil, fmt.Errorf("CDI's own CRD: %w", err)
	}
	objects := []crclient.Object{cdiCRD}
	for _, group := range clusterGroups {
		group, err := cluster.CreateStaticResourceGroup(group, &cluster.FactoryArgs{Namespace: ns})
		if err != nil {
			return nil, err
		}
		objects = append(objects, group...)
	}
	return objects, nil
}

// releaseCR is CDI's release CR: the workload placement every importer pod reads, and the feature gates.
func releaseCR() *cdiv1.CDI {
	linux := map[string]string{"kubernetes.io/os": "linux"}
	return &cdiv1.CDI{
		ObjectMeta: metav1.ObjectMeta{Name: "cdi"},
		Spec: cdiv1.CDISpec{
			ImagePullPolicy: corev1.PullIfNotPresent,
			Config:          &cdiv1.CDIConfigSpec{FeatureGates: releaseGates},
			Infra:           cdiv1.ComponentConfig{NodePlacement: sdkapi.NodePlacement{NodeSelector: linux}},
			Workloads:       sdkapi.NodePlacement{NodeSelector: linux},
		},
	}
}

// setGates gives the CDIConfig the CR's feature gates, as the operator copies the CR's `config` into it.
func setGates(ctx context.Context, c crclient.Client) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		config := &cdiv1.CDIConfig{}
		err := c.Get(ctx, crclient.ObjectKey{Name: "config"}, config)
		if k8serrors.IsNotFound(err) {
			config = &cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{Name: "config"}}
			config.Spec.FeatureGates = releaseGates
			err = c.Create(ctx, config)
		} else if err == nil {
			config.Spec.FeatureGates = releaseGates
			err = c.Update(ctx, config)
		}
		if k8serrors.IsConflict(err) || k8serrors.IsAlreadyExists(err) || k8serrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
}

// signerObjects: the operator's certificate definitions for the signers the controller reads, each filled with a
// new CA (its key and certificate, and a bundle of that certificate), as its certificate rotation would.
func signerObjects(ns string) ([]crclient.Object, error) {
	var objects []crclient.Object
	for _, def := range cert.CreateCertificateDefinitions(&cert.FactoryArgs{Namespace: ns}) {
		if def.SignerSecret == nil || !controllerSigners[def.SignerSecret.Name] {
			continue
		}
		key, crt, err := newCA(def.SignerSecret.Name)
		if err != nil {
			return nil, err
		}
		def.SignerSecret.Data = map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key}
		objects = append(objects, def.SignerSecret)
		if def.CertBundleConfigmap != nil {
			def.CertBundleConfigmap.Data = map[string]string{"ca-bundle.crt": string(crt)}
			objects = append(objects, def.CertBundleConfigmap)
		}
	}
	if len(objects) != 2*len(controllerSigners) {
		return nil, fmt.Errorf("CDI's certificate definitions lack a signer the controller reads: %v", controllerSigners)
	}
	return objects, nil
}

func newCA(name string) (keyPEM, certPEM []byte, err error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, nil, err
	}
	ca, err := certutil.NewSelfSignedCACert(certutil.Config{CommonName: name}, key)
	if err != nil {
		return nil, nil, err
	}
	if keyPEM, err = keyutil.MarshalPrivateKeyToPEM(key); err != nil {
		return nil, nil, err
	}
	certPEM, err = certutil.EncodeCertificates(ca)
	return keyPEM, certPEM, err
}

func applyAll(ctx context.Context, c crclient.Client, objects []crclient.Object) error {
	for _, o := range objects {
		if err := apply(ctx, c, o); err != nil {
			return err
		}
	}
	return nil
}

// apply creates `o`, or replaces what is there by it.
func apply(ctx context.Context, c crclient.Client, o crclient.Object) error {
	err := c.Create(ctx, o)
	if k8serrors.IsAlreadyExists(err) {
		existing := o.DeepCopyObject().(crclient.Object)
		if err = c.Get(ctx, crclient.ObjectKeyFromObject(o), existing); err == nil {
			o.SetResourceVersion(existing.GetResourceVersion())
			err = c.Update(ctx, o)
		}
	}
	if err != nil {
		return fmt.Errorf("%T %s: %w", o, crclient.ObjectKeyFromObject(o), err)
	}
	return nil
}

func waitEstablished(ctx context.Context, c crclient.Client, name string) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		crd := &extv1.CustomResourceDefinition{}
		if err := c.Get(ctx, crclient.ObjectKey{Name: name}, crd); err != nil {
			return false, err
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == extv1.Established && cond.Status == extv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}
