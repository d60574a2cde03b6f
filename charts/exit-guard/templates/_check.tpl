{{/* The pod of `exit-guard check`: helm test's Pod and check.afterSync's Job run the same. */}}
{{- define "exit-guard.checkPodSpec" -}}
{{- $r := .root -}}
restartPolicy: Never
serviceAccountName: {{ .name }}
{{- with $r.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml $r.Values.podSecurityContext | nindent 2 }}
{{- /* Scheduled where the guard is, unless check.* says otherwise. */}}
{{- with $r.Values.check.priorityClassName | default $r.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $r.Values.check.nodeSelector | default $r.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $r.Values.check.tolerations | default $r.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $r.Values.check.affinity | default $r.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: check
    image: {{ include "exit-guard.image" $r }}
    imagePullPolicy: {{ $r.Values.image.pullPolicy }}
    args:
      - check
      - --namespace={{ .ns }}
      - --image={{ include "exit-guard.image" $r }}
      - --timeout={{ $r.Values.check.timeout | default "3m" }}
    securityContext:
      {{- toYaml $r.Values.securityContext | nindent 6 }}
    resources:
      requests:
        cpu: 10m
        memory: 32Mi
      limits:
        memory: 64Mi
{{- end }}
