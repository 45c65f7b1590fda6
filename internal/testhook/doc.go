// Package testhook holds the hooks the tests drive the agent with: crash
// points, where a crash must leave the store and the node's disk in a
// state the agent resumes from; pause points, for the tests of fencing;
// and a clock offset, for the capture's clock. They are built only under
// the testhooks build tag, which the tests and the chaos suite use; in a
// release binary (make build, make image) each is a no-op and the
// variables below are ignored.
package testhook
