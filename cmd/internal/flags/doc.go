// Package flags registers the commands' flags on their configurations.
// Flags live here, under cmd/, and nowhere else: the packages under
// internal/ take a Config with Default and Validate, and know nothing of
// pflag or cobra.
package flags
