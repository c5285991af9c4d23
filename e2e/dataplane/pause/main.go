// pause: the sandbox ("infra") container of every Pod on the e2e data plane's kubelet.
// It holds the Pod's namespaces open and does nothing: waits for SIGINT/SIGTERM and
// reaps children re-parented to it. Built statically and packed into an image
// `FROM scratch` by e2e/dataplane/images.py, because no registry can be reached here.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-children:
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
