// Package lease decides which agent may lead while etcd cannot: the store
// lock, whose terms are the fencing tokens every step and call carries;
// the fence that holds a term on this process's own clock; and the two
// checks leader election rests on, that the store honours create-if-absent
// and that the agents' clocks agree.
package lease
