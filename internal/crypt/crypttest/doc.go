// Package crypttest makes age keys for tests, as age-keygen writes them.
package crypttest
