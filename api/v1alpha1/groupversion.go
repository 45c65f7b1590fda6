// Package v1alpha1 holds the etcd-manager.dev/v1alpha1 API: EtcdCluster,
// EtcdBackup, EtcdBackupSchedule and EtcdRestore, the objects the operator
// maps onto the engine's spec, commands and status in the backup store.
//
// +kubebuilder:object:generate=true
// +groupName=etcd-manager.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of these objects.
var GroupVersion = schema.GroupVersion{Group: "etcd-manager.dev", Version: "v1alpha1"}

// AddToScheme registers the types of this package with a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&EtcdCluster{}, &EtcdClusterList{},
		&EtcdBackup{}, &EtcdBackupList{},
		&EtcdBackupSchedule{}, &EtcdBackupScheduleList{},
		&EtcdRestore{}, &EtcdRestoreList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
