package envtest

import (
	"crypto/x509"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	"github.com/etcd-manager/etcd-manager/api/v1alpha1"
	"github.com/etcd-manager/etcd-manager/internal/pki"
)

// A client credential comes in <name>-client-tls, renewed with a third of
// its life left; a live cluster's deleted CA Secret is never made again.
func TestClientSecretAndCAMissing(t *testing.T) {
	ns := newNamespace(t)
	ctx := t.Context()
	c := validCluster(ns, "tls")
	if err := k8s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	memberPod(t, c, 0)
	fakeCtl.setMembers("tls", "tls-0")

	var caSec, sec corev1.Secret
	caKey := types.NamespacedName{Namespace: ns, Name: "tls-ca"}
	key := types.NamespacedName{Namespace: ns, Name: "tls-client-tls"}
	waitFor(t, "the client Secret", 30*time.Second, func() (bool, string) {
		err := k8s.Get(ctx, key, &sec)
		return err == nil, fmt.Sprint(err)
	})
	if err := k8s.Get(ctx, caKey, &caSec); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseCA(caSec.Data["tls.crt"], caSec.Data["tls.key"])
	if err != nil {
		t.Fatal(err)
	}
	check := func(s corev1.Secret) *x509.Certificate {
		t.Helper()
		if s.Type != corev1.SecretTypeTLS || string(s.Data["ca.crt"]) != string(caSec.Data["tls.crt"]) || len(s.Data["tls.key"]) == 0 {
			t.Fatalf("client Secret: type %s, keys %d, ca.crt the CA's: %v", s.Type, len(s.Data), string(s.Data["ca.crt"]) == string(caSec.Data["tls.crt"]))
		}
		cert, err := pki.ParseCertPEM(s.Data["tls.crt"])
		if err != nil {
			t.Fatal(err)
		}
		if err := ca.Verify(cert, pki.RoleClient, time.Now()); err != nil {
			t.Fatalf("the client certificate: %v", err)
		}
		if _, ok := s.Data["ca.key"]; ok {
			t.Fatal("the client Secret holds the CA's key")
		}
		return cert
	}
	first := check(sec)
	if life := first.NotAfter.Sub(first.NotBefore); life < 80*24*time.Hour {
		t.Errorf("client certificate valid for %s", life)
	}

	// A certificate at its renewal point is replaced.
	short, shortKey, err := ca.Issue(pki.CertRequest{CommonName: "tls-client", Role: pki.RoleClient, Validity: time.Minute}, nil, time.Now().Add(-50*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	sec.Data["tls.crt"], sec.Data["tls.key"] = short, shortKey
	if err := k8s.Update(ctx, &sec); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the client certificate renewed", 30*time.Second, func() (bool, string) {
		if err := k8s.Get(ctx, key, &sec); err != nil {
			return false, err.Error()
		}
		cert, err := pki.ParseCertPEM(sec.Data["tls.crt"])
		return err == nil && cert.NotAfter.Sub(cert.NotBefore) > time.Hour, fmt.Sprint(err)
	})
	check(sec)

	// The CA Secret of a live cluster deleted: held, never made again.
	if err := k8s.Delete(ctx, &caSec); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "CAMissing", 30*time.Second, func() (bool, string) {
		cond := meta.FindStatusCondition(getCluster(t, c).Status.Conditions, v1alpha1.ConditionDegraded)
		return cond != nil && cond.Reason == "CAMissing" && strings.Contains(cond.Message, "tls-ca"), fmt.Sprintf("%+v", cond)
	})
	time.Sleep(4 * time.Second)
	if err := k8s.Get(ctx, caKey, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the CA Secret of a live cluster was made again: %v", err)
	}
	// Back: the cluster goes on.
	caSec.ResourceVersion, caSec.UID = "", ""
	if err := k8s.Create(ctx, &caSec); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Degraded no longer CAMissing", 30*time.Second, func() (bool, string) {
		cond := meta.FindStatusCondition(getCluster(t, c).Status.Conditions, v1alpha1.ConditionDegraded)
		return cond != nil && cond.Reason != "CAMissing", fmt.Sprintf("%+v", cond)
	})
}
