{{/* This release's name prefix: the release name when it contains "leoflow", else "<release>-leoflow". */}}
{{- define "leoflow.fullname" -}}
{{- if contains "leoflow" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-leoflow" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "leoflow.labels" -}}
app.kubernetes.io/name: leoflow
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/part-of: airflow
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end -}}

{{/* Namespace of the official Airflow chart (scheduler, api-server, the ConfigMap). */}}
{{- define "leoflow.airflowNamespace" -}}
{{- default .Release.Namespace .Values.airflow.namespace -}}
{{- end -}}

{{- define "leoflow.schedulerServiceAccount" -}}
{{- default (printf "%s-scheduler" .Values.airflow.fullname) .Values.airflow.schedulerServiceAccount -}}
{{- end -}}

{{- define "leoflow.apiServerServiceAccount" -}}
{{- default (printf "%s-api-server" .Values.airflow.fullname) .Values.airflow.apiServerServiceAccount -}}
{{- end -}}

{{- define "leoflow.apiServerUrl" -}}
{{- $default := printf "http://%s-api-server.%s.svc.cluster.local:8080" .Values.airflow.fullname (include "leoflow.airflowNamespace" .) -}}
{{- default $default .Values.airflow.apiServerUrl | trimSuffix "/" -}}
{{- end -}}

{{- define "leoflow.exchangeUrl" -}}
{{- default (printf "%s/leoflow" (include "leoflow.apiServerUrl" .)) .Values.leoflow.exchangeUrl -}}
{{- end -}}

{{- define "leoflow.image" -}}
{{- $repo := required "image.repository is required: the agent image (docker/Dockerfile)" .Values.image.repository -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Where the ConfigMap is mounted in the scheduler and api-server containers. */}}
{{- define "leoflow.mountPath" -}}
{{- printf "%s/leoflow" (trimSuffix "/" .Values.airflow.home) -}}
{{- end -}}

{{- define "leoflow.podTemplatePath" -}}
{{- printf "%s/pod_template_file.yaml" (include "leoflow.mountPath" .) -}}
{{- end -}}

{{/* A scalar value as text. helm reads every number as a float: a whole one is written as an integer
(1000000, never 1e+06). */}}
{{- define "leoflow.scalar" -}}
{{- if and (kindIs "float64" .) (eq (float64 .) (floor .)) -}}
{{- int64 . | toString -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* The [leoflow] options as a dict: what the chart sets, then leoflow.config (which cannot override those). */}}
{{- define "leoflow.options" -}}
{{- $opts := dict -}}
{{- range $k, $v := .Values.leoflow.config -}}
{{- $_ := set $opts $k (include "leoflow.scalar" $v) -}}
{{- end -}}
{{- $_ := set $opts "runtime" "kubernetes" -}}
{{- $_ := set $opts "namespace" .Values.taskNamespace.name -}}
{{- $_ := set $opts "service_account" .Values.taskServiceAccount.name -}}
{{- $_ := set $opts "image" (include "leoflow.image" .) -}}
{{- $_ := set $opts "pod_template_file" (include "leoflow.podTemplatePath" .) -}}
{{- $_ := set $opts "exchange_url" (include "leoflow.exchangeUrl" .) -}}
{{- toYaml $opts -}}
{{- end -}}
