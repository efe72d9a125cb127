# The cluster's certificate authority, certificates and kubeconfigs (openssl). Sourced by ../cluster.
# cert NAME CN [O] [SANS]: an EC P-256 key and a certificate signed by the cluster CA; with SANS it also serves.
cert() {
  local name=$1 cn=$2 o=${3:-} san=${4:-} subj
  subj="/CN=$cn"; [ -z "$o" ] || subj="/O=$o/CN=$cn"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$name.key"
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [ -n "$san" ]; then echo "extendedKeyUsage=serverAuth,clientAuth"; echo "subjectAltName=$san"
    else echo "extendedKeyUsage=clientAuth"; fi
  } >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 30 \
    -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}
# kubeconfig_for OUT CERT SERVER
kubeconfig_for() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $CLUSTER_NAME
  cluster: {server: "$3", certificate-authority: "$PKI/ca.crt"}
users:
- name: $2
  user: {client-certificate: "$PKI/$2.crt", client-key: "$PKI/$2.key"}
contexts:
- name: $CLUSTER_NAME
  context: {cluster: $CLUSTER_NAME, user: $2}
current-context: $CLUSTER_NAME
EOF
}
pki_up() { # API_HOST
  local api_host=$1
  mkdir -p "$PKI"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key"
  openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=$CLUSTER_NAME-ca" -days 30 -out "$PKI/ca.crt"
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  cert apiserver kube-apiserver "" \
    "IP:$api_host,IP:127.0.0.1,IP:$KUBERNETES_SERVICE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  cert admin admin system:masters
  cert controller-manager system:kube-controller-manager
  cert scheduler system:kube-scheduler
  cert kube-proxy system:kube-proxy
  local server=https://$api_host:$API_PORT c
  for c in controller-manager scheduler kube-proxy; do kubeconfig_for "$CLUSTER_DIR/$c.kubeconfig" $c "$server"; done
  # Written last: its presence means "the API server this names is (being) started".
  kubeconfig_for "$CLUSTER_DIR/kubeconfig.tmp" admin "$server"
}
