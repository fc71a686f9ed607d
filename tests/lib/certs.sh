# Test certificates made with openssl (P-256, valid two days), in the
# current directory. Source it after defining fail().

_ssl() { openssl "$@" >/dev/null 2>&1 || fail "openssl $*"; }

# new_ca NAME: a self-signed CA, NAME.pem and NAME.key.
new_ca() {
  command -v openssl >/dev/null || fail "openssl is missing: run tools/install_deps.sh"
  _ssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj "/CN=$1" -keyout "$1.key" -out "$1.pem"
}

# new_cert NAME CA EXTENSIONS: NAME.pem signed by CA, and NAME.key (mode 600);
# EXTENSIONS as in an openssl extfile, e.g. 'subjectAltName=IP:127.0.0.1'.
new_cert() {
  _ssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$1" \
    -keyout "$1.key" -out "$1.csr"
  printf '%s\n' "$3" >"$1.ext"
  _ssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 2 \
    -extfile "$1.ext" -out "$1.pem"
  chmod 600 "$1.key"
}

# The certificates a ferryd on loopback and its client need: ca, server
# (127.0.0.1 and localhost) and client.
new_loopback_certs() {
  new_ca ca
  new_cert server ca $'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth'
  new_cert client ca $'extendedKeyUsage=clientAuth'
}
