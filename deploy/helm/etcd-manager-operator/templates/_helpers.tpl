{{- define "etcd-manager-operator.labels" -}}
app.kubernetes.io/name: etcd-manager-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "etcd-manager-operator.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- /*
The name of the release's objects: the release name when it names the chart
already (helm install etcd-manager-operator ...), else <release>-etcd-manager-operator,
so that two releases never share a name.
*/ -}}
{{- define "etcd-manager-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}
{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end -}}
{{- end -}}
{{- /* The namespaces the operator watches: watchNamespaces, and the older watchNamespace. */ -}}
{{- define "etcd-manager-operator.namespaces" -}}
{{- $ns := .Values.watchNamespaces | default list -}}
{{- with .Values.watchNamespace }}{{ $ns = append $ns . }}{{ end -}}
{{- join "," (uniq $ns) -}}
{{- end -}}
