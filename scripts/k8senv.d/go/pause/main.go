// Command pause is the sandbox container of the real test node's pods (containerd's sandbox_image): it holds
// the pod's namespaces and does nothing else. It reaps any child re-parented to it, and exits 0 on SIGINT or
// SIGTERM, which is how the container runtime stops a sandbox. Written here because the test machine cannot
// pull registry.k8s.io/pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
