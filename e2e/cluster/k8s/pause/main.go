// Command pause is the pod sandbox's first process: it holds the pod's namespaces open, reaps the
// orphans re-parented to it (it is PID 1 of the sandbox) and exits on SIGINT or SIGTERM. It is the
// local cluster's counterpart of registry.k8s.io/pause, which cannot be pulled on an offline machine.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reapAll()
	}
}

// reapAll collects every exited child without blocking; one SIGCHLD may stand for several exits.
func reapAll() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
