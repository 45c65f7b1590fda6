package operator

import (
	"bytes"
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
	"github.com/etcd-manager/etcd-manager/internal/pki"
)

// ClientSecretName is the Secret holding a client credential of the
// cluster: what a kube-apiserver or an application mounts to reach etcd,
// so that no one needs the CA's key.
func ClientSecretName(c *v1alpha1.EtcdCluster) string { return c.Name + "-client-tls" }

// ClientCertValidity is the life of the client certificate in the client
// Secret; it is renewed with a third of it left.
const ClientCertValidity = 90 * 24 * time.Hour

// clientSecretCA is the Secret's key of the CA certificate, beside the
// kubernetes.io/tls pair.
const clientSecretCA = "ca.crt"

// ensureClientSecret keeps <name>-client-tls holding a client certificate
// from the cluster's CA, with the CA's certificate: made when missing,
// renewed when a third of its life is left or the CA changed. Without TLS
// for etcd, clients need none, and it is not made.
func (r *ClusterReconciler) ensureClientSecret(ctx context.Context, c *v1alpha1.EtcdCluster) error {
	if !TLSEnabled(c) {
		return nil
	}
	var caSec corev1.Secret
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: CASecretName(c)}, &caSec); err != nil {
		return fmt.Errorf("operator: the CA Secret %s: %w", CASecretName(c), err)
	}
	caPEM := caSec.Data[corev1.TLSCertKey]
	var sec corev1.Secret
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: ClientSecretName(c)}, &sec)
	switch {
	case err == nil:
		why := clientSecretStale(&sec, caPEM, r.now())
		if why == "" {
			return nil
		}
		return r.issueClientSecret(ctx, c, &caSec, &sec, why)
	case apierrors.IsNotFound(err):
		sec = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: ClientSecretName(c), Namespace: c.Namespace}}
		return r.issueClientSecret(ctx, c, &caSec, &sec, "")
	}
	return fmt.Errorf("operator: the client Secret %s: %w", ClientSecretName(c), err)
}

// clientSecretStale says why the client Secret needs a new certificate,
// or "" when it does not.
func clientSecretStale(sec *corev1.Secret, caPEM []byte, now time.Time) string {
	if !bytes.Equal(sec.Data[clientSecretCA], caPEM) {
		return "the CA changed"
	}
	cert, err := pki.ParseCertPEM(sec.Data[corev1.TLSCertKey])
	if err != nil {
		return "its certificate is unreadable"
	}
	if !now.Before(pki.RenewAt(cert)) {
		return "a third of its life is left"
	}
	return ""
}

func (r *ClusterReconciler) issueClientSecret(ctx context.Context, c *v1alpha1.EtcdCluster, caSec, sec *corev1.Secret, why string) error {
	ca, err := pki.ParseCA(caSec.Data[corev1.TLSCertKey], caSec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return fmt.Errorf("operator: the CA Secret %s: %w", caSec.Name, err)
	}
	certPEM, keyPEM, err := ca.Issue(pki.CertRequest{CommonName: ClientServiceName(c), Role: pki.RoleClient, Validity: ClientCertValidity}, nil, r.now())
	if err != nil {
		return err
	}
	create := sec.CreationTimestamp.IsZero()
	sec.Labels = commonLabels(c)
	sec.Type = corev1.SecretTypeTLS
	sec.Data = map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM, clientSecretCA: caSec.Data[corev1.TLSCertKey]}
	// It goes with the cluster: a new one is issued for a cluster made
	// again.
	if err := controllerutil.SetControllerReference(c, sec, r.Client.Scheme()); err != nil {
		return err
	}
	if create {
		err = r.Client.Create(ctx, sec)
	} else {
		err = r.Client.Update(ctx, sec)
	}
	if err != nil {
		return fmt.Errorf("operator: write the client Secret %s: %w", sec.Name, err)
	}
	msg := "issued a client certificate into Secret %s"
	if why != "" {
		msg = "renewed the client certificate in Secret %s: " + why
	}
	r.Events.Eventf(c, nil, corev1.EventTypeNormal, reasonClientCert, "IssueClientCert", msg, sec.Name)
	return nil
}
