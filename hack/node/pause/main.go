// Command pause is the sandbox image of the real node (make e2e-node): it holds a pod's
// namespaces and waits for its end, as Kubernetes' pause image does.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}
