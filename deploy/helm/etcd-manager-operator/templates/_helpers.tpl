{{- define "etcd-manager-operator.labels" -}}
app.kubernetes.io/name: etcd-manager-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "etcd-manager-operator.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
