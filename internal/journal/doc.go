// Package journal keeps an agent's event history (etcd-manager-ctl
// events): every change it makes to the cluster and every failure, as a
// small object in the store's events/ prefix. A failure that repeats is
// recorded once, then at most every ten minutes with the count since, and
// with the success that ends it. Recording never blocks the caller: events
// wait in a bounded queue for a writer of their own.
package journal
