{{/* Names, labels and the TLS material shared by the templates. */}}

{{- define "isthmus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every resource name: the release name, plus the chart name unless it already contains it. */}}
{{- define "isthmus.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "isthmus.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "isthmus.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: isthmus
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The operator's pods. app.kubernetes.io/name is what the operator's defaults also assume. */}}
{{- define "isthmus.operator.selector" -}}
app.kubernetes.io/name: isthmus-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The agents' pods; the operator finds agents with exactly this selector (ISTHMUS_AGENT_SELECTOR). */}}
{{- define "isthmus.agent.selector" -}}
app.kubernetes.io/name: isthmus-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "isthmus.operator.serviceAccount" -}}{{ include "isthmus.fullname" . }}-operator{{- end -}}
{{- define "isthmus.agent.serviceAccount" -}}{{ include "isthmus.fullname" . }}-agent{{- end -}}

{{/*
The operator's identity towards the agents: the DNS SAN of its client certificate, which every agent requires
(agent/src/auth.rs): <serviceaccount>.<namespace>.serviceaccount.isthmus.
*/}}
{{- define "isthmus.operator.identity" -}}
{{- printf "%s.%s.serviceaccount.isthmus" (include "isthmus.operator.serviceAccount" .) .Release.Namespace -}}
{{- end -}}

{{/*
Objects the operator creates and maintains through the API (never rendered: a CA key in a rendered Secret would
sit in every Helm release revision): the CA Secret, the CA bundle the agents mount, the scraper's client Secret.
*/}}
{{- define "isthmus.secret.ca" -}}{{ include "isthmus.fullname" . }}-ca{{- end -}}
{{- define "isthmus.configmap.caBundle" -}}{{ include "isthmus.fullname" . }}-ca-bundle{{- end -}}
{{- define "isthmus.secret.scraper" -}}{{ include "isthmus.fullname" . }}-metrics-scraper-tls{{- end -}}
{{/*
The NetworkTopology admission webhook: its Service, the DNS name the API server calls it by (the name of its
serving certificate), and its ValidatingWebhookConfiguration (cluster-scoped: named after the release).
*/}}
{{- define "isthmus.webhook.service" -}}{{ include "isthmus.fullname" . }}-operator-webhook{{- end -}}
{{- define "isthmus.webhook.dnsName" -}}{{ include "isthmus.webhook.service" . }}.{{ .Release.Namespace }}.svc{{- end -}}
{{- /* The name every agent's serving certificate carries besides its node's: the agents' metrics Service's. */ -}}
{{- define "isthmus.agent.metricsService" -}}{{ include "isthmus.fullname" . }}-agent-metrics{{- end -}}
{{- define "isthmus.agent.sharedDnsName" -}}{{ include "isthmus.agent.metricsService" . }}.{{ .Release.Namespace }}.svc{{- end -}}
{{/* The name of the operator's HTTPS metrics listener's certificate: its metrics Service's DNS name. */}}
{{- define "isthmus.operator.metricsDnsName" -}}{{ include "isthmus.fullname" . }}-operator-metrics.{{ .Release.Namespace }}.svc{{- end -}}
{{- define "isthmus.webhook.configuration" -}}{{ include "isthmus.fullname" . }}-networktopologies{{- end -}}
{{/* The hold's MutatingWebhookConfiguration (cluster-scoped: named after the release). */}}
{{- define "isthmus.hold.configuration" -}}{{ include "isthmus.fullname" . }}-hold{{- end -}}
{{/* The signer of the agents' serving certificates (isthmus_agent_api::identity::AGENT_SIGNER_NAME). */}}
{{- define "isthmus.signerName" -}}isthmus.dev/agent-serving{{- end -}}

{{/*
The identity that may read the agents' /metrics (on the API port, mutual TLS) and nothing else:
<fullname>-metrics-scraper.<namespace>.isthmus.
*/}}
{{- define "isthmus.scraper.identity" -}}
{{- printf "%s-metrics-scraper.%s.isthmus" (include "isthmus.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "isthmus.operator.image" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) -}}
{{- end -}}
{{- define "isthmus.agent.image" -}}
{{- printf "%s:%s" .Values.agent.image.repository (default .Chart.AppVersion .Values.agent.image.tag) -}}
{{- end -}}

{{/* "k=v,k=v" from the agent selector, for the operator's --agent-selector. */}}
{{- define "isthmus.agent.selectorString" -}}
{{- $pairs := list -}}
{{- range $k, $v := (include "isthmus.agent.selector" . | fromYaml) -}}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
