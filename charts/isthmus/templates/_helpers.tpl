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

{{- define "isthmus.secret.ca" -}}{{ include "isthmus.fullname" . }}-ca{{- end -}}
{{- define "isthmus.secret.agent" -}}{{ include "isthmus.fullname" . }}-agent-tls{{- end -}}
{{- define "isthmus.secret.operator" -}}{{ include "isthmus.fullname" . }}-operator-tls{{- end -}}
{{- define "isthmus.secret.scraper" -}}{{ include "isthmus.fullname" . }}-metrics-scraper-tls{{- end -}}

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

{{/*
The CA and the two leaf certificates, as YAML (call once per render: generation is random).

Stable across `helm upgrade`: the existing Secrets are read back with `lookup` and reused as long as
- the CA Secret exists and is valid for more than tls.renewBeforeDays (else a new CA, hence new leaves);
- a leaf Secret was signed by that CA (its ca.crt matches), carries the expected identity (annotation), and is
  valid for more than tls.renewBeforeDays.
`helm template` and client-side dry runs cannot look up, so they always show freshly generated material.
Rotation: delete the Secret(s) and run `helm upgrade`; agents and operator re-read the files without restarting.
*/}}
{{- define "isthmus.tls.material" -}}
{{- $ns := .Release.Namespace -}}
{{- $days := int .Values.tls.validityDays -}}
{{- $now := now | unixEpoch | int64 -}}
{{- $horizon := add $now (mul (int .Values.tls.renewBeforeDays) 86400) -}}
{{- $notAfter := add $now (mul $days 86400) | toString -}}
{{- $ca := dict -}}
{{- $caOut := dict -}}
{{- $old := lookup "v1" "Secret" $ns (include "isthmus.secret.ca" .) -}}
{{- $oldAnn := dig "metadata" "annotations" dict $old -}}
{{- if and $old (gt (int64 (get $oldAnn "isthmus.dev/not-after" | default "0")) $horizon) (hasKey (dig "data" dict $old) "tls.key") -}}
{{- $ca = buildCustomCert (index $old.data "tls.crt") (index $old.data "tls.key") -}}
{{- $_ := set $caOut "notAfter" (get $oldAnn "isthmus.dev/not-after") -}}
{{- else -}}
{{- $ca = genCA "isthmus-ca" $days -}}
{{- $_ := set $caOut "notAfter" $notAfter -}}
{{- end -}}
{{- $_ := set $caOut "crt" $ca.Cert -}}
{{- $_ := set $caOut "key" $ca.Key -}}
{{- $out := dict "ca" $caOut -}}
{{- $leaves := list
      (list "agent" (include "isthmus.secret.agent" .) .Values.tls.agentServerName)
      (list "operator" (include "isthmus.secret.operator" .) (include "isthmus.operator.identity" .))
      (list "scraper" (include "isthmus.secret.scraper" .) (include "isthmus.scraper.identity" .)) -}}
{{- range $leaves -}}
{{- $role := index . 0 -}}
{{- $identity := index . 2 -}}
{{- $leaf := dict "identity" $identity -}}
{{- $prev := lookup "v1" "Secret" $ns (index . 1) -}}
{{- $prevAnn := dig "metadata" "annotations" dict $prev -}}
{{- $prevData := dig "data" dict $prev -}}
{{- if and $prev
      (eq (get $prevData "ca.crt") (b64enc $ca.Cert))
      (eq (get $prevAnn "isthmus.dev/identity") $identity)
      (gt (int64 (get $prevAnn "isthmus.dev/not-after" | default "0")) $horizon) -}}
{{- $_ := set $leaf "crt" (get $prevData "tls.crt" | b64dec) -}}
{{- $_ := set $leaf "key" (get $prevData "tls.key" | b64dec) -}}
{{- $_ := set $leaf "notAfter" (get $prevAnn "isthmus.dev/not-after") -}}
{{- else -}}
{{- $cert := genSignedCert $identity nil (list $identity) $days $ca -}}
{{- $_ := set $leaf "crt" $cert.Cert -}}
{{- $_ := set $leaf "key" $cert.Key -}}
{{- $_ := set $leaf "notAfter" $notAfter -}}
{{- end -}}
{{- $_ := set $out $role $leaf -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}
