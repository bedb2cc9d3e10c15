{{/* The controller's image, and the worker image its Jobs run (the same unless set). */}}
{{- define "ferry.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- define "ferry.workerImage" -}}
{{ .Values.workerImage | default (include "ferry.image" .) }}
{{- end -}}

{{/* What RBAC and the admission policies name the controller by. */}}
{{- define "ferry.username" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ .Values.serviceAccount.name }}
{{- end -}}

{{/*
Cluster-scoped objects of an install other than the default one (ferry-system/ferry) carry its namespace in their
names, so two installs (each serving its own namespaces) own distinct objects.
*/}}
{{- define "ferry.suffix" -}}
{{- if not (and (eq .Release.Namespace "ferry-system") (eq .Values.serviceAccount.name "ferry")) -}}
-{{ .Release.Namespace }}
{{- end -}}
{{- end -}}

{{/* deploy/'s manifests are applied by kubectl, so they carry no release's labels. */}}
{{- define "ferry.labels" -}}
app.kubernetes.io/name: ferry
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- if not .Values.renderedAsManifests }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}
{{- end -}}

{{- define "ferry.selector" -}}
app.kubernetes.io/name: ferry
app.kubernetes.io/component: controller
{{- end -}}

{{- define "ferry.subject" -}}
- kind: ServiceAccount
  name: {{ .Values.serviceAccount.name }}
  namespace: {{ .Release.Namespace }}
{{- end -}}
