{{/*
The task pods' template ([leoflow] pod_template_file): what the cluster needs (user, resources, placement, pull
secrets, the Execution API's URL), nothing leoflow pins. No `command`: the agent image's entrypoint runs the
arguments the pod builder sets (`python -m leoflow_agent pod`). No image: [leoflow] image sets it.
*/}}
{{- define "leoflow.podTemplate" -}}
{{- $env := list (dict "name" "AIRFLOW__CORE__EXECUTION_API_SERVER_URL" "value" (printf "%s/execution/" (include "leoflow.apiServerUrl" .))) -}}
{{- range .Values.pod.env -}}
{{- $env = append $env (dict "name" .name "value" (include "leoflow.scalar" .value)) -}}
{{- end -}}
{{- $container := dict "name" "base" "imagePullPolicy" .Values.pod.imagePullPolicy "env" $env -}}
{{- with .Values.pod.resources }}{{ $_ := set $container "resources" . }}{{ end -}}
{{- with .Values.pod.extraVolumeMounts }}{{ $_ := set $container "volumeMounts" . }}{{ end -}}
{{- $security := dict "runAsUser" (int .Values.pod.runAsUser) "runAsGroup" (int .Values.pod.runAsGroup) "fsGroup" (int .Values.pod.fsGroup) "runAsNonRoot" true "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- $spec := dict "securityContext" $security "containers" (list $container) -}}
{{- with .Values.pod.imagePullSecrets -}}
{{- $secrets := list -}}
{{- range . }}{{ $secrets = append $secrets (dict "name" .) }}{{ end -}}
{{- $_ := set $spec "imagePullSecrets" $secrets -}}
{{- end -}}
{{- with .Values.pod.nodeSelector }}{{ $_ := set $spec "nodeSelector" . }}{{ end -}}
{{- with .Values.pod.tolerations }}{{ $_ := set $spec "tolerations" . }}{{ end -}}
{{- with .Values.pod.affinity }}{{ $_ := set $spec "affinity" . }}{{ end -}}
{{- with .Values.pod.priorityClassName }}{{ $_ := set $spec "priorityClassName" . }}{{ end -}}
{{- with .Values.pod.extraVolumes }}{{ $_ := set $spec "volumes" . }}{{ end -}}
{{- $meta := dict -}}
{{- with .Values.pod.labels }}{{ $_ := set $meta "labels" . }}{{ end -}}
{{- with .Values.pod.annotations }}{{ $_ := set $meta "annotations" . }}{{ end -}}
{{- $pod := dict "apiVersion" "v1" "kind" "Pod" "spec" $spec -}}
{{- if $meta }}{{ $_ := set $pod "metadata" $meta }}{{ end -}}
{{- toYaml $pod -}}
{{- end -}}
