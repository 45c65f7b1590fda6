// Package drill runs one restore drill: a backup fetched, restored into a
// scratch etcd on loopback under the agent's tmp/, and compared with its
// meta (revision and HashKV). It never touches the cluster; when drills
// are due, and what becomes of their outcome, is the controller's.
package drill
