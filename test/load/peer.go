package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"path/filepath"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// liveGetCommand runs the live-GET peer: the design of a Kyverno policy with an apiCall, a
// webhook that GETs the owning workflow, whole, on every pod it is sent, and refuses an exit
// handler whose workflow Succeeded.
const liveGetCommand = "liveget"

func runLiveGet(args []string) error {
	fs := flag.NewFlagSet(liveGetCommand, flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:9443", "Where to serve, over TLS.")
	certDir := fs.String("cert-dir", "", "The folder of tls.crt and tls.key.")
	probe := fs.String("probe", "127.0.0.1:0", "The address of /readyz.")
	ctx, stop, err := startChild(fs, args)
	if err != nil {
		return err
	}
	defer stop()
	cfg, err := unthrottledConfig()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/validate-pod", func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		var pod corev1.Pod
		if err := json.Unmarshal(review.Request.Object.Raw, &pod); err == nil {
			if _, exit := pod.Labels[argo.LabelOnExit]; exit {
				if ref := metav1.GetControllerOf(&pod); ref != nil && ref.Kind == argo.Kind {
					wf := &unstructured.Unstructured{}
					wf.SetGroupVersionKind(argo.WorkflowGVK)
					err := c.Get(r.Context(), client.ObjectKey{Namespace: pod.Namespace, Name: ref.Name}, wf)
					phase, _, _ := unstructured.NestedString(wf.Object, "status", "phase")
					if err == nil && wf.GetUID() == ref.UID && phase == string(argo.PhaseSucceeded) {
						resp.Allowed = false
						resp.Result = &metav1.Status{Code: http.StatusForbidden, Message: "the workflow Succeeded"}
					}
				}
			}
		}
		review.Response, review.Request = resp, nil
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&review)
	})
	// Served as the guard is: HTTP/1.1 only.
	tc := &tls.Config{}
	floorTLS(tc)
	srv := &http.Server{Addr: *addr, Handler: mux, TLSConfig: tc, ReadHeaderTimeout: 5 * time.Second,
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}}
	probeMux := http.NewServeMux()
	probeMux.HandleFunc("/readyz", func(http.ResponseWriter, *http.Request) {})
	probeSrv := &http.Server{Addr: *probe, Handler: probeMux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
		_ = probeSrv.Close()
	}()
	go func() { _ = probeSrv.ListenAndServe() }()
	err = srv.ListenAndServeTLS(filepath.Join(*certDir, "tls.crt"), filepath.Join(*certDir, "tls.key"))
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving: %w", err)
	}
	return nil
}
