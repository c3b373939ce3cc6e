{{/*
Names: every name is truncated to 63 characters (the DNS label limit) with a trailing "-" trimmed.
*/}}
{{- define "flexinfer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-<chart>, or <release> when it already contains the chart name; fullnameOverride wins. */}}
{{- define "flexinfer.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The name of one component's objects: (dict "ctx" $ "component" "proxy"). The prefix is cut so that
     the component suffix always survives the 63-character limit (no two components share a name). */}}
{{- define "flexinfer.componentName" -}}
{{- $prefix := include "flexinfer.fullname" .ctx | trunc (int (sub 62 (len .component))) | trimSuffix "-" }}
{{- printf "%s-%s" $prefix .component }}
{{- end }}

{{- define "flexinfer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Standard labels of every object: (dict "ctx" $ "component" "proxy"). */}}
{{- define "flexinfer.labels" -}}
helm.sh/chart: {{ include "flexinfer.chart" .ctx }}
{{ include "flexinfer.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: flexinfer
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels (immutable in a Deployment: never add more later). */}}
{{- define "flexinfer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flexinfer.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* One image reference: (dict "ctx" $ "image" <registry/repository/tag dict> "tag" <default tag>). */}}
{{- define "flexinfer.imageRef" -}}
{{- $registry := .ctx.Values.global.imageRegistry | default .image.registry -}}
{{- $tag := .image.tag | default .tag -}}
{{- if $registry }}{{ printf "%s/%s:%s" $registry .image.repository $tag }}{{ else }}{{ printf "%s:%s" .image.repository $tag }}{{ end -}}
{{- end }}

{{/* The FlexInfer image (tag default: appVersion). */}}
{{- define "flexinfer.image" -}}
{{- include "flexinfer.imageRef" (dict "ctx" . "image" .Values.image "tag" .Chart.AppVersion) -}}
{{- end }}

{{/* The kube-scheduler image (tag default: the cluster's vX.Y.Z). */}}
{{- define "flexinfer.schedulerImage" -}}
{{- $kube := regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version | default "v1.33.0" -}}
{{- include "flexinfer.imageRef" (dict "ctx" . "image" .Values.extender.scheduler.image "tag" $kube) -}}
{{- end }}


{{/* Pod-level security of every workload (non-root, RuntimeDefault seccomp). */}}
{{- define "flexinfer.podSecurityContext" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end }}

{{/* Container-level security of every container (no privilege escalation, read-only root, no capabilities). */}}
{{- define "flexinfer.securityContext" -}}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
{{- end }}

{{/* Service names and URLs the code must be told (never hard-coded there). */}}
{{- define "flexinfer.proxyServiceName" -}}{{ include "flexinfer.componentName" (dict "ctx" . "component" "proxy") }}{{- end }}
{{- define "flexinfer.proxyURL" -}}
{{- printf "http://%s.%s.svc.cluster.local:%v" (include "flexinfer.proxyServiceName" .) .Release.Namespace .Values.proxy.service.port -}}
{{- end }}
{{- define "flexinfer.extenderURL" -}}
{{- printf "http://%s.%s.svc.cluster.local:%v" (include "flexinfer.componentName" (dict "ctx" . "component" "extender")) .Release.Namespace .Values.extender.port -}}
{{- end }}
{{- define "flexinfer.benchServiceAccount" -}}{{ include "flexinfer.componentName" (dict "ctx" . "component" "bench") }}{{- end }}
{{- define "flexinfer.peeringName" -}}{{ .Values.operator.peeringName | default (include "flexinfer.fullname" .) }}{{- end }}
{{- define "flexinfer.proxyNamespace" -}}{{ .Values.proxy.watchNamespace | default .Release.Namespace }}{{- end }}

{{/* The /tmp emptyDir every container gets (read-only root filesystem). */}}
{{- define "flexinfer.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end }}
{{- define "flexinfer.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end }}

{{/* env entries from a name -> value map. */}}
{{- define "flexinfer.envMap" -}}
{{- range $k, $v := . }}
- name: {{ $k }}
  value: {{ $v | toString | quote }}
{{- end }}
{{- end }}

{{/* Redis shared by the proxy replicas: the URL the proxy is given ("" when off or from a Secret). */}}
{{- define "flexinfer.redisServiceName" -}}{{ include "flexinfer.componentName" (dict "ctx" . "component" "redis") }}{{- end }}
{{- define "flexinfer.redisURL" -}}
{{- if .Values.redis.deploy -}}
{{- printf "redis://%s.%s.svc.cluster.local:6379/0" (include "flexinfer.redisServiceName" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.redis.url -}}
{{- end -}}
{{- end }}
{{- define "flexinfer.redisOn" -}}{{ if or .Values.redis.deploy .Values.redis.url .Values.redis.existingSecret }}true{{ end }}{{- end }}
