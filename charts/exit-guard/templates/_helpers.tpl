{{/* The chart's name. */}}
{{- define "exit-guard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every resource name. */}}
{{- define "exit-guard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "exit-guard.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "exit-guard.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels of the guard's pods, for selectors. */}}
{{- define "exit-guard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "exit-guard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "exit-guard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "exit-guard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Metadata annotations of every resource. */}}
{{- define "exit-guard.annotations" -}}
{{- with .Values.commonAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The ServiceAccount the guard runs as. */}}
{{- define "exit-guard.serviceAccountName" -}}
{{- if eq .Values.installMode "sidecar" }}
{{- include "exit-guard.controllerServiceAccount" . }}
{{- else if .Values.serviceAccount.create }}
{{- default (include "exit-guard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: a digest wins over a tag. */}}
{{/*
The image: global.image.registry or image.registry, then image.repository, unless the repository
names a registry itself (its first part has a . or :, or is localhost: the values of a release
before image.registry existed); then the digest, or the tag (the chart's appVersion by default).
*/}}
{{- define "exit-guard.image" -}}
{{- $repo := .Values.image.repository }}
{{- $first := first (splitList "/" $repo) }}
{{- $named := and (gt (len (splitList "/" $repo)) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $registry := dig "image" "registry" "" (.Values.global | default dict) | default .Values.image.registry }}
{{- if and $registry (not $named) }}{{ $repo = printf "%s/%s" (trimSuffix "/" $registry) $repo }}{{ end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "exit-guard.serviceName" -}}
{{- printf "%s-webhook" (include "exit-guard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "exit-guard.secretName" -}}
{{- printf "%s-webhook-tls" (include "exit-guard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "exit-guard.webhookConfigName" -}}
{{- include "exit-guard.fullname" . }}
{{- end }}

{{/* The DNS name the API server calls. */}}
{{- define "exit-guard.dnsName" -}}
{{- printf "%s.%s.svc" (include "exit-guard.serviceName" .) .Release.Namespace }}
{{- end }}

{{/* true when the mutating webhook (which marks suspect pods) is registered instead of the validating one. */}}
{{- define "exit-guard.mutating" -}}
{{- if has .Values.guard.mode (list "warn" "dry-run") }}true{{ end }}
{{- end }}

{{/* The guard's command line: the chart's own flags, then extraArgs, checked. */}}
{{- define "exit-guard.args" -}}
{{- $own := include "exit-guard.ownArgs" . }}
{{- include "exit-guard.checkExtraArgs" (dict "own" $own "extra" .Values.extraArgs) }}
{{- $own }}
{{- with .Values.extraArgs }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Refuses an extraArgs entry that sets a flag the chart sets from a typed value: the last flag
wins, so it would override the value past the chart's checks (timings, certificates).
*/}}
{{- define "exit-guard.checkExtraArgs" -}}
{{- $set := dict }}
{{- range $line := splitList "\n" .own }}
{{- $flag := regexFind "--[a-z0-9-]+" $line }}
{{- if $flag }}{{ $_ := set $set $flag true }}{{ end }}
{{- end }}
{{- range $arg := .extra }}
{{- $flag := regexFind "^--?[a-z0-9-]+" (toString $arg) | trimPrefix "-" | trimPrefix "-" | printf "--%s" }}
{{- if hasKey $set $flag }}
{{- fail (printf "extraArgs sets %s, which the chart sets from its values: set the value instead (exit-guard --help names each flag; values.yaml the value)" $flag) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The pods the guard judges, as --cover takes them, from guard.cover. */}}
{{- define "exit-guard.cover" -}}
{{- $items := splitList "," .Values.guard.cover }}
{{- $hooks := or (has "all" $items) (has "hooks" $items) }}
{{- $steps := or (has "all" $items) (has "steps" $items) }}
{{- if and $hooks $steps }}all{{ else }}exit-handlers{{ if $hooks }},hooks{{ end }}{{ if $steps }},steps{{ end }}{{ end }}
{{- end }}

{{/* guard.hookStepReadBudget, 750ms (the guard's default) when the values lack it (--reuse-values). */}}
{{- define "exit-guard.hookStepReadBudget" -}}
{{- .Values.guard.hookStepReadBudget | default "750ms" }}
{{- end }}

{{/* The guard's flags the chart sets from its values. */}}
{{- define "exit-guard.ownArgs" -}}
- --mode={{ .Values.guard.mode }}
- --deny-phases={{ join "," .Values.guard.denyPhases }}
- --cover={{ include "exit-guard.cover" . }}
- --store-first={{ .Values.guard.storeFirst }}
- --live-read-timeout={{ .Values.guard.liveReadTimeout }}
- --live-read-budget={{ .Values.guard.liveReadBudget }}
- --hook-step-read-budget={{ include "exit-guard.hookStepReadBudget" . }}
- --live-read-get-after={{ .Values.guard.liveReadGetAfter }}
- --taskset-repeats-for={{ .Values.guard.taskSetRepeatsFor }}
- --event-read-timeout={{ .Values.guard.eventReadTimeout }}
- --event-read-budget={{ .Values.guard.eventReadBudget }}
- --store-fallback={{ .Values.guard.storeFallback }}
- --store-fresh-for={{ .Values.guard.storeFreshFor }}
- --store-refusals-for={{ .Values.guard.storeRefusalsFor | default "2m" }}
- --namespaces={{ join "," .Values.guard.namespaces }}
- --completion-ttl={{ .Values.guard.completionTTL }}
- --sweep-interval={{ .Values.guard.sweepInterval }}
- --lock-check-interval={{ .Values.guard.lockCheckInterval }}
- --lock-stuck-after={{ .Values.guard.lockStuckAfter }}
- --max-concurrent-decisions={{ .Values.guard.maxConcurrentDecisions }}
- --expected-requester={{ include "exit-guard.expectedRequester" . }}
{{- if .Values.webhook.clientAuth.caConfigMap }}
- --webhook-client-ca-file=/etc/exit-guard/client-ca/{{ .Values.webhook.clientAuth.caKey }}
{{- end }}
- --shutdown-delay={{ .Values.shutdownDelay }}
- --graceful-shutdown-timeout={{ .Values.gracefulShutdownTimeout }}
- --webhook-port={{ .Values.webhook.port }}
- --webhook-cert-path=/tmp/k8s-webhook-server/serving-certs
- --metrics-bind-address=:{{ .Values.metrics.port }}
- --health-probe-bind-address=:{{ .Values.probePort }}
{{- if .Values.metrics.secure }}
- --metrics-secure
{{- with .Values.metrics.tokenAudiences }}
- --metrics-token-audiences={{ join "," . }}
{{- end }}
{{- end }}
{{- if .Values.pprof.enabled }}
- --pprof-bind-address={{ .Values.pprof.bindAddress }}
{{- end }}
- --zap-log-level={{ .Values.logging.level }}
- --zap-encoder={{ .Values.logging.format }}
{{- if eq .Values.certificates.mode "self" }}
- --cert-mode=self
- --cert-secret={{ include "exit-guard.secretName" . }}
- --cert-dns-name={{ include "exit-guard.dnsName" . }}
{{- $served := include "exit-guard.servedWebhooks" . | fromJson }}
{{- if $served.MutatingWebhookConfiguration }}
- --mutating-webhook-configuration={{ include "exit-guard.webhookConfigName" . }}
{{- end }}
{{- if $served.ValidatingWebhookConfiguration }}
- --validating-webhook-configuration={{ include "exit-guard.webhookConfigName" . }}
{{- end }}
- --server-cert-duration={{ .Values.certificates.self.serverCertDuration }}
- --cert-lookahead={{ .Values.certificates.self.lookahead }}
- --cert-check-frequency={{ .Values.certificates.self.checkFrequency }}
{{- end }}
{{- end }}

{{/*
The guard's container: in the Deployment (include with the root context), and in the sidecar
values (exit-guard.sidecarContainer), where it restarts in its process rather than exit, has no
readiness probe (the controller's pod would be NotReady when the guard is), names its ports
apart from the controller's, and carries the pod's security settings itself.
*/}}
{{- define "exit-guard.container" -}}
{{- include "exit-guard.containerOf" (dict "root" . "sidecar" false) }}
{{- end }}

{{- define "exit-guard.sidecarContainer" -}}
{{- include "exit-guard.containerOf" (dict "root" . "sidecar" true) }}
{{- end }}

{{- define "exit-guard.containerOf" -}}
{{- $ := .root }}
{{- $sidecar := .sidecar }}
{{- $metrics := ternary "eg-metrics" "metrics" $sidecar }}
{{- $probes := ternary "eg-probes" "probes" $sidecar -}}
name: exit-guard
image: {{ include "exit-guard.image" $ }}
imagePullPolicy: {{ $.Values.image.pullPolicy }}
args:
  {{- $args := include "exit-guard.args" $ }}
  {{- if $sidecar }}
  {{- $args = replace (printf "--health-probe-bind-address=:%v" $.Values.probePort) (printf "--health-probe-bind-address=:%v" $.Values.sidecar.probePort) $args }}
  {{- end }}
  {{- $args | nindent 2 }}
  {{- if $sidecar }}
  # A failure restarts the guard in its process: an exiting container would make the
  # controller's pod NotReady (docs/sidecar.md).
  - --restart-on-failure
  {{- end }}
env:
  - name: POD_NAMESPACE
    valueFrom:
      fieldRef:
        fieldPath: metadata.namespace
  {{- if ($.Values.resources.limits | default dict).memory }}
  # The guard holds its Go heap to 90% of this (GOMEMLIMIT in extraEnv wins).
  - name: EXIT_GUARD_MEMORY_LIMIT
    valueFrom:
      resourceFieldRef:
        containerName: exit-guard
        resource: limits.memory
  {{- end }}
  {{- with $.Values.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
ports:
  - name: webhook
    containerPort: {{ $.Values.webhook.port }}
    protocol: TCP
  - name: {{ $metrics }}
    containerPort: {{ $.Values.metrics.port }}
    protocol: TCP
  - name: {{ $probes }}
    containerPort: {{ ternary $.Values.sidecar.probePort $.Values.probePort $sidecar }}
    protocol: TCP
livenessProbe:
  {{- toYaml (merge (dict "httpGet" (dict "path" "/healthz" "port" $probes)) ($.Values.livenessProbe | default dict)) | nindent 2 }}
{{- if $sidecar }}
# No readiness probe: the guard's readiness must not become the controller pod's.
{{- else }}
readinessProbe:
  {{- toYaml (merge (dict "httpGet" (dict "path" "/readyz" "port" $probes)) ($.Values.readinessProbe | default dict)) | nindent 2 }}
{{- end }}
resources:
  {{- toYaml $.Values.resources | nindent 2 }}
securityContext:
  {{- if $sidecar }}
  {{- /* The controller's pod has its own pod security context: the container carries the guard's. */}}
  {{- toYaml (merge (deepCopy $.Values.securityContext) (pick $.Values.podSecurityContext "runAsNonRoot" "runAsUser" "runAsGroup" "seccompProfile")) | nindent 2 }}
  {{- else }}
  {{- toYaml $.Values.securityContext | nindent 2 }}
  {{- end }}
volumeMounts:
  - name: exit-guard-webhook-tls
    mountPath: /tmp/k8s-webhook-server/serving-certs
    readOnly: true
  {{- if $.Values.webhook.clientAuth.caConfigMap }}
  - name: exit-guard-client-ca
    mountPath: /etc/exit-guard/client-ca
    readOnly: true
  {{- end }}
  {{- with $.Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/*
The values of the community argo-workflows chart that add the guard to Argo's workflow-controller
pod (installMode sidecar): rendered into the ConfigMap <fullname>-sidecar, and, for the default
values, into examples/sidecar-values.yaml (make manifests).
*/}}
{{- define "exit-guard.sidecarValues" -}}
# Values for the community argo-workflows chart that run exit-guard inside the pod of Argo's
# workflow-controller, rendered by exit-guard's chart (release {{ .Release.Name }} in {{ .Release.Namespace }}, installMode
# sidecar) from its values: add them to Argo's release with helm upgrade ... -f <this file>
# (docs/sidecar.md). The certificate volume is optional, so that Argo's controller pod starts
# without exit-guard's Secret. The guard expects requests from
# {{ include "exit-guard.expectedRequester" . }} (guard.expectedRequester, by default the
# controller's ServiceAccount: sidecar.argoRelease or sidecar.controllerServiceAccount).
controller:
  extraContainers:
    - {{ include "exit-guard.sidecarContainer" . | nindent 6 | trim }}
  volumes:
    # Optional whatever the certificate mode: uninstalling exit-guard deletes the Secret, and a
    # volume that is not optional would keep the controller's next pod from starting.
    - name: exit-guard-webhook-tls
      secret:
        secretName: {{ include "exit-guard.secretName" . }}
        optional: true
    {{- if .Values.webhook.clientAuth.caConfigMap }}
    - name: exit-guard-client-ca
      configMap:
        name: {{ .Values.webhook.clientAuth.caConfigMap }}
        optional: true
    {{- end }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/*
The workflow-controller's ServiceAccount in sidecar mode: sidecar.controllerServiceAccount, or
argo-helm's name for the release sidecar.argoRelease (its argo-workflows.fullname, then
"-workflow-controller", each cut to 63 characters as argo-helm cuts them).
*/}}
{{- define "exit-guard.controllerServiceAccount" -}}
{{- if .Values.sidecar.controllerServiceAccount }}
{{- .Values.sidecar.controllerServiceAccount }}
{{- else }}
{{- $release := .Values.sidecar.argoRelease }}
{{- $fullname := ternary $release (printf "%s-argo-workflows" $release) (contains "argo-workflows" $release) | trunc 63 | trimSuffix "-" }}
{{- printf "%s-workflow-controller" $fullname | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
The user the guard expects to send what it judges: guard.expectedRequester, or in sidecar mode
the controller's ServiceAccount, which the chart knows.
*/}}
{{- define "exit-guard.expectedRequester" -}}
{{- if .Values.guard.expectedRequester }}
{{- .Values.guard.expectedRequester }}
{{- else if eq .Values.installMode "sidecar" }}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "exit-guard.controllerServiceAccount" .) }}
{{- end }}
{{- end }}

{{/* The volume of the API server's client CA (webhook.clientAuth). */}}
{{- define "exit-guard.clientCAVolume" -}}
name: exit-guard-client-ca
configMap:
  name: {{ .Values.webhook.clientAuth.caConfigMap }}
{{- end }}

{{/* The volume holding the serving certificate. */}}
{{- define "exit-guard.volume" -}}
name: exit-guard-webhook-tls
secret:
  secretName: {{ include "exit-guard.secretName" . }}
  {{- if eq .Values.certificates.mode "self" }}
  # The guard fills the Secret after the pod starts.
  optional: true
  {{- end }}
{{- end }}

{{/* A duration of the values ("250ms" or "4s", as the schema allows) in milliseconds. */}}
{{- define "exit-guard.millis" -}}
{{- if hasSuffix "ms" . }}{{ trimSuffix "ms" . | int }}{{ else }}{{ mul (trimSuffix "s" . | int) 1000 }}{{ end }}
{{- end }}

{{/*
Refuses timings that do not fit: the live read (its budget) and a second for the store fallback,
the answer and the network must fit in the webhook's timeoutSeconds, or the API server gives up
on the guard first and applies the failure policy to every slow decision.
*/}}
{{/* The seconds of a duration such as 8760h, 90m, 1h30m or 45s. */}}
{{- define "exit-guard.seconds" -}}
{{- $total := 0 }}
{{- range $part := regexFindAll "[0-9]+[hms]" . -1 }}
{{- $n := trimSuffix "h" $part | trimSuffix "m" | trimSuffix "s" | int }}
{{- if hasSuffix "h" $part }}{{ $total = add $total (mul $n 3600) }}{{ else if hasSuffix "m" $part }}{{ $total = add $total (mul $n 60) }}{{ else }}{{ $total = add $total $n }}{{ end }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
exit-guard.checkSidecarPorts refuses, in sidecar mode, a port of the guard that Argo's
controller pod already uses (networkPolicy.controllerPorts): two containers of one pod cannot
bind the same port, and the guard would crash-loop beside the controller.
*/}}
{{- define "exit-guard.checkSidecarPorts" -}}
{{- if eq .Values.installMode "sidecar" }}
{{- $taken := dict }}
{{- range .Values.networkPolicy.controllerPorts }}
{{- $_ := set $taken (toString .port) true }}
{{- end }}
{{- range $name, $port := dict "webhook.port" .Values.webhook.port "metrics.port" .Values.metrics.port "sidecar.probePort" .Values.sidecar.probePort }}
{{- if hasKey $taken (toString $port) }}
{{- fail (printf "%s (%v) is a port of Argo's controller pod (networkPolicy.controllerPorts): the sidecar cannot bind it; choose another" $name $port) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "exit-guard.checkTimings" -}}
{{- if eq .Values.certificates.mode "self" }}
{{- $c := .Values.certificates.self }}
{{- if le (include "exit-guard.seconds" $c.serverCertDuration | int) (include "exit-guard.seconds" $c.lookahead | int) }}
{{- fail (printf "certificates.self.lookahead (%s) is not shorter than certificates.self.serverCertDuration (%s): the guard would renew the certificate on every check" $c.lookahead $c.serverCertDuration) }}
{{- end }}
{{- if lt (include "exit-guard.seconds" $c.lookahead | int) (mul 2 (include "exit-guard.seconds" $c.checkFrequency | int)) }}
{{- fail (printf "certificates.self.lookahead (%s) is shorter than two checks (certificates.self.checkFrequency %s): a check could come after the certificate expired" $c.lookahead $c.checkFrequency) }}
{{- end }}
{{- end }}
{{- if eq .Values.certificates.mode "cert-manager" }}
{{- $c := .Values.certificates.certManager }}
{{- if le (include "exit-guard.seconds" $c.duration | int) (include "exit-guard.seconds" $c.renewBefore | int) }}
{{- fail (printf "certificates.certManager.renewBefore (%s) is not shorter than certificates.certManager.duration (%s)" $c.renewBefore $c.duration) }}
{{- end }}
{{- if and (not $c.issuerRef) (le (include "exit-guard.seconds" $c.caDuration | int) (include "exit-guard.seconds" $c.duration | int)) }}
{{- fail (printf "certificates.certManager.caDuration (%s) is not longer than certificates.certManager.duration (%s): every serving certificate would need a new CA" $c.caDuration $c.duration) }}
{{- end }}
{{- end }}
{{- $timeout := include "exit-guard.millis" .Values.guard.liveReadTimeout | int }}
{{- $budget := include "exit-guard.millis" .Values.guard.liveReadBudget | int }}
{{- $webhook := mul .Values.webhook.timeoutSeconds 1000 | int }}
{{- if gt $timeout $budget }}
{{- fail (printf "guard.liveReadTimeout (%s) is longer than guard.liveReadBudget (%s)" .Values.guard.liveReadTimeout .Values.guard.liveReadBudget) }}
{{- end }}
{{- $grace := mul (int .Values.terminationGracePeriodSeconds) 1000 | int }}
{{- if and (ne .Values.installMode "sidecar") (gt (add (include "exit-guard.millis" .Values.shutdownDelay | int) (include "exit-guard.millis" .Values.gracefulShutdownTimeout | int)) $grace) }}
{{- fail (printf "shutdownDelay (%s) and gracefulShutdownTimeout (%s) do not fit in terminationGracePeriodSeconds (%d)" .Values.shutdownDelay .Values.gracefulShutdownTimeout (int .Values.terminationGracePeriodSeconds)) }}
{{- end }}
{{- if gt (add $budget 1000) $webhook }}
{{- fail (printf "guard.liveReadBudget (%s) does not fit in webhook.timeoutSeconds (%d): keep it at least 1s shorter" .Values.guard.liveReadBudget (int .Values.webhook.timeoutSeconds)) }}
{{- end }}
{{- if gt (add (include "exit-guard.millis" (include "exit-guard.hookStepReadBudget" .) | int) 1000) $webhook }}
{{- fail (printf "guard.hookStepReadBudget (%s) does not fit in webhook.timeoutSeconds (%d): keep it at least 1s shorter" (include "exit-guard.hookStepReadBudget" .) (int .Values.webhook.timeoutSeconds)) }}
{{- end }}
{{- $eventTimeout := include "exit-guard.millis" .Values.guard.eventReadTimeout | int }}
{{- $eventBudget := include "exit-guard.millis" .Values.guard.eventReadBudget | int }}
{{- if gt $eventTimeout $eventBudget }}
{{- fail (printf "guard.eventReadTimeout (%s) is longer than guard.eventReadBudget (%s)" .Values.guard.eventReadTimeout .Values.guard.eventReadBudget) }}
{{- end }}
{{- if and .Values.webhook.events.enabled (gt (add $eventBudget 1000) (mul .Values.webhook.events.timeoutSeconds 1000 | int)) }}
{{- fail (printf "guard.eventReadBudget (%s) does not fit in webhook.events.timeoutSeconds (%d): keep it at least 1s shorter" .Values.guard.eventReadBudget (int .Values.webhook.events.timeoutSeconds)) }}
{{- end }}
{{- end }}

{{/*
The webhooks' namespaceSelector: webhook.namespaceSelector, and with guard.namespaces only those
namespaces too (the API server then never calls the guard for a namespace it does not watch).
*/}}
{{- define "exit-guard.namespaceSelector" -}}
{{- $sel := deepCopy (.Values.webhook.namespaceSelector | default dict) }}
{{- with .Values.guard.namespaces }}
{{- $exprs := append ($sel.matchExpressions | default list) (dict "key" "kubernetes.io/metadata.name" "operator" "In" "values" .) }}
{{- $_ := set $sel "matchExpressions" $exprs }}
{{- end }}
{{- toYaml $sel }}
{{- end }}

{{/*
The values of the kind whose generated webhook is named .name, as JSON: enabled, failurePolicy,
timeoutSeconds, extraMatchConditions. The pod webhooks take webhook's own; the WorkflowTaskSet and
Event webhooks webhook.taskSets and webhook.events; a kind added later webhook.kinds.<its
webhook's name up to the first dot, without validate- or mutate->. What a kind leaves unset is
webhook's: on, its failure policy and timeout.
*/}}
{{- define "exit-guard.kindValues" -}}
{{- $root := .root }}
{{- $named := dict "validate.exit-guard.io" "" "mutate.exit-guard.io" "" "validate-taskset.exit-guard.io" "taskSets" "validate-event.exit-guard.io" "events" }}
{{- $v := dict }}
{{- if hasKey $named .name }}
{{- $key := get $named .name }}
{{- if $key }}
{{- $v = deepCopy (default dict (get $root.Values.webhook $key)) }}
{{- else }}
{{- $v = dict "extraMatchConditions" $root.Values.webhook.extraMatchConditions }}
{{- end }}
{{- else }}
{{- $key := regexReplaceAll "^(validate|mutate)-" (first (splitList "." .name)) "" }}
{{- $v = deepCopy (default dict (get (default dict $root.Values.webhook.kinds) $key)) }}
{{- end }}
{{- if not (hasKey $v "enabled") }}{{ $_ := set $v "enabled" true }}{{ end }}
{{- if not $v.failurePolicy }}{{ $_ := set $v "failurePolicy" $root.Values.webhook.failurePolicy }}{{ end }}
{{- if not $v.timeoutSeconds }}{{ $_ := set $v "timeoutSeconds" $root.Values.webhook.timeoutSeconds }}{{ end }}
{{- toJson $v }}
{{- end }}

{{/*
The match conditions guard.cover adds to the pod webhooks, as a YAML list: none when it covers
every pod; without hooks, every pod but a lifecycle hook's; without steps, only exit-handler,
agent (and, with hooks, hook) pods. Roles as the guard reads them (classify, webhook/pod.go):
an exit handler's pod by Argo's on-exit label, the agent by its component label, a hook's by
its node name with the owning workflow's name stripped holding .hooks.; never from a piece of
a name alone.
*/}}
{{- define "exit-guard.coverConditions" -}}
{{- $cover := include "exit-guard.cover" . }}
{{- $hooks := or (eq $cover "all") (contains "hooks" $cover) }}
{{- $steps := or (eq $cover "all") (contains "steps" $cover) }}
{{- if and $steps $hooks }}
[]
{{- end }}
{{- $hook := "has(object.metadata.annotations) && 'workflows.argoproj.io/node-name' in object.metadata.annotations &&\n    has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller && r.kind == 'Workflow' &&\n    object.metadata.annotations['workflows.argoproj.io/node-name'].startsWith(r.name) &&\n    object.metadata.annotations['workflows.argoproj.io/node-name'].substring(size(r.name)).contains('.hooks.'))" }}
{{- if and $steps (not $hooks) }}
- name: not-a-lifecycle-hook-pod
  expression: >-
    (has(object.metadata.labels) && 'workflows.argoproj.io/on-exit' in object.metadata.labels) ||
    !({{ $hook }})
{{- end }}
{{- if not $steps }}
- name: {{ ternary "exit-handler-hook-or-agent-pod" "exit-handler-or-agent-pod" $hooks }}
  expression: >-
    (has(object.metadata.labels) && 'workflows.argoproj.io/component' in object.metadata.labels) ||
    (has(object.metadata.labels) && 'workflows.argoproj.io/on-exit' in object.metadata.labels)
    {{- if $hooks }} ||
    ({{ $hook }})
    {{- end }}
{{- end }}
{{- end }}

{{/*
The webhooks the chart registers, as JSON, by kind of configuration: every webhook of
files/webhook/manifests.yaml (which make manifests generates from the markers of the code's
kinds) that the mode serves and its kind's values leave on. In enforce mode every validating
webhook; in warn and dry-run mode the mutating ones (a kind that marks suspect objects), and the
validating ones of the kinds that do not mark (no mutating webhook has their rules). The marking
kinds' validating webhooks come first. webhook.yaml renders them; the guard's flags and RBAC
name the kinds of configuration that hold any.
*/}}
{{- define "exit-guard.servedWebhooks" -}}
{{- $mutating := eq (include "exit-guard.mutating" .) "true" }}
{{- $mutatingHooks := list }}
{{- $validatingHooks := list }}
{{- range $doc := splitList "---" (.Files.Get "files/webhook/manifests.yaml") }}
{{- $c := fromYaml $doc }}
{{- range $w := (default list $c.webhooks) }}
{{- if eq (default "" $c.kind) "MutatingWebhookConfiguration" }}{{ $mutatingHooks = append $mutatingHooks $w }}{{ end }}
{{- if eq (default "" $c.kind) "ValidatingWebhookConfiguration" }}{{ $validatingHooks = append $validatingHooks $w }}{{ end }}
{{- end }}
{{- end }}
{{- if not $validatingHooks }}{{ fail "files/webhook/manifests.yaml has no validating webhook: run make manifests" }}{{ end }}
{{- $markedFirst := list }}
{{- $others := list }}
{{- range $w := $validatingHooks }}
{{- $marked := false }}
{{- range $m := $mutatingHooks }}{{ if eq (toJson $m.rules) (toJson $w.rules) }}{{ $marked = true }}{{ end }}{{ end }}
{{- $v := include "exit-guard.kindValues" (dict "root" $ "name" $w.name) | fromJson }}
{{- if and $v.enabled $marked (not $mutating) }}{{ $markedFirst = append $markedFirst $w }}{{ end }}
{{- if and $v.enabled (not $marked) }}{{ $others = append $others $w }}{{ end }}
{{- end }}
{{- $marking := list }}
{{- if $mutating }}
{{- range $m := $mutatingHooks }}
{{- $v := include "exit-guard.kindValues" (dict "root" $ "name" $m.name) | fromJson }}
{{- if $v.enabled }}{{ $marking = append $marking $m }}{{ end }}
{{- end }}
{{- if not $mutatingHooks }}{{ fail "files/webhook/manifests.yaml has no mutating webhook for warn or dry-run mode: run make manifests" }}{{ end }}
{{- end }}
{{- if .Values.webhook.enabled }}
{{- toJson (dict "MutatingWebhookConfiguration" $marking "ValidatingWebhookConfiguration" (concat $markedFirst $others)) }}
{{- else }}
{{- /* The kill switch: no webhook configuration, so the API server calls the guard for nothing. */}}
{{- toJson (dict "MutatingWebhookConfiguration" list "ValidatingWebhookConfiguration" list) }}
{{- end }}
{{- end }}
