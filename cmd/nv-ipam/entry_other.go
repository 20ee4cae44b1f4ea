//go:build !linux || !amd64

package main

// undoEntry has nothing to do where the plugin has no entry point of its own
// (see entry_linux_amd64.go).
func undoEntry() {}
