{{/*
Object names are fixed: one autoscaler per cluster, and the RBAC names its ConfigMaps and Lease.
*/}}
{{- define "gna.name" -}}gpu-node-autoscaler{{- end }}

{{/* Labels of every object: deploy/'s, and Helm's own. */}}
{{- define "gna.labels" -}}
app.kubernetes.io/name: gpu-node-autoscaler
app.kubernetes.io/part-of: gpu-node-autoscaler
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The controller's pods. */}}
{{- define "gna.selector" -}}
app.kubernetes.io/name: gpu-node-autoscaler
app.kubernetes.io/component: controller
{{- end }}

{{- define "gna.policyConfigMap" -}}
{{- .Values.policy.existingConfigMap | default "gpu-node-autoscaler-policy" }}
{{- end }}
