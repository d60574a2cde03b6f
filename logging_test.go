package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestFirstStartErrorsAreSaidAsRetried: the certificate rotator's conflicts and its read of a
// Secret not yet written are info lines that say retried; every other error stays an error.
func TestFirstStartErrorsAreSaidAsRetried(t *testing.T) {
	var lines []string
	log := newLogger(funcr.New(func(prefix, args string) { lines = append(lines, prefix+" "+args) }, funcr.Options{}))
	conflict := apierrors.NewConflict(schema.GroupResource{Resource: "secrets"}, "exit-guard-webhook-tls", errors.New("the object has been modified"))
	rotator := log.WithName("cert-rotation").WithValues("name", "exit-guard")
	rotator.Error(conflict, "could not refresh CA and server certs")
	rotator.Error(errors.New("Cert secret is not well-formed, missing ca.crt"), "secret is not well-formed, cannot update webhook configurations")
	rotator.Error(errors.New("x509: certificate signed by unknown authority"), "could not refresh server certs")
	log.WithName("setup").Error(conflict, "unable to update")
	got := strings.Join(lines, "\n")
	for _, want := range []string{
		`cert-rotation "level"=0 "msg"="could not refresh CA and server certs: retried" "name"="exit-guard" "reason"=`,
		`cert-rotation "level"=0 "msg"="secret is not well-formed, cannot update webhook configurations: retried" "name"="exit-guard" "reason"="Cert secret is not well-formed, missing ca.crt"`,
		`cert-rotation "msg"="could not refresh server certs" "error"="x509: certificate signed by unknown authority"`,
		`setup "msg"="unable to update" "error"=`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the log lacks %s:\n%s", want, got)
		}
	}
}
