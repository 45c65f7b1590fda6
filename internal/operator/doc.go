// Package operator is the Kubernetes front end of the engine: it maps an
// EtcdCluster onto a StatefulSet of agents, Services, a PodDisruptionBudget
// and the cluster spec in the backup store, and EtcdBackup and EtcdRestore
// objects onto the store's command queue. The agents do the rest, exactly
// as on VMs.
package operator
