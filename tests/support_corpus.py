"""The generated corpus: 300+ credential formats, FAKE and valid-shaped, built at run time.

Three sources, none of which writes a whole credential into this repository:

* ``structural()`` — the forms no prefix catches, written here as templates: secret-like keys in every
  file syntax, connection strings of every syntax, command-line password flags, HTTP headers, auth
  tuples, key blocks in every armour, base64 blobs that decode to a credential, Kubernetes and
  framework secrets; and vendor tokens by their documented prefix.
* ``from_rules()`` — one sample per rule of gitleaks' set as the installed package ships it: a string
  generated from the rule's own (translated) pattern, with the secret group filled at random. It checks
  the translation, the keyword prefilter and each surface for every family gitleaks knows.
* tests/data/secret_corpus.json (87 hand-written formats, ``support_secrets.corpus``).

A template is text with ``{alphabet:length}`` holes filled by a generator seeded with the format's id;
every hole of 8 characters or more is a random part that must not appear anywhere (``Sample.telltales``).
"""

from __future__ import annotations

import base64
import json
import random
import re
import string
from functools import cache
from re import _parser as sre  # type: ignore[attr-defined]
from typing import Any

from memactors import redact as redact_module
from support_secrets import Sample, corpus

ALPHABETS = {
    "alnum": string.ascii_letters + string.digits,
    "alpha": string.ascii_letters,
    "lower": string.ascii_lowercase,
    "lalnum": string.ascii_lowercase + string.digits,
    "ualnum": string.ascii_uppercase + string.digits,
    "hex": "0123456789abcdef",
    "HEX": "0123456789ABCDEF",
    "digit": string.digits,
    "b64": string.ascii_letters + string.digits + "+/",
    "b64url": string.ascii_letters + string.digits + "_-",
    "b32": "abcdefghijklmnopqrstuvwxyz234567",
    "pw": "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789!#%*+-=?^_",
    "urlpw": "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789-._~",
}
_HOLE = re.compile(r"\{(\w+):(\d+)\}")


def _fill(fid: str, template: str) -> tuple[str, tuple[str, ...]]:
    rng = random.Random(f"corpus31/{fid}")
    parts: list[str] = []

    def hole(m: re.Match[str]) -> str:
        kind, n = m.group(1), int(m.group(2))
        public = kind.endswith("_pub")  # an id or a public hash beside the secret: may stay
        kind = kind.removesuffix("_pub")
        if kind == "uuid":
            value = "-".join("".join(rng.choice(ALPHABETS["hex"]) for _ in range(k)) for k in (8, 4, 4, 4, 12))
        else:
            value = "".join(rng.choice(ALPHABETS[kind]) for _ in range(n))
        if len(value) >= 8 and not public:
            parts.append(value)
        return value

    return _HOLE.sub(hole, template), tuple(parts)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _blob(fid: str, template: str) -> tuple[str, tuple[str, ...]]:
    """A template whose ``[[b64:...]]`` sections are base64-encoded after filling: a credential that is
    only visible decoded. The random parts are then the encoded blob's runs (what could leak)."""
    text, _ = _fill(fid, template)
    parts: list[str] = []

    def enc(m: re.Match[str]) -> str:
        value = _b64(m.group(1))
        parts.append(value)
        return value

    return re.sub(r"\[\[b64:(.*?)\]\]", enc, text, flags=re.S), tuple(parts)


PEM_BODY = "\n".join(["{b64:64}"] * 4 + ["{b64:40}=="])

#: (id, template): the structural forms and vendor prefixes. Every secret here is fake.
TEMPLATES: tuple[tuple[str, str], ...] = (
    # --- secret-like keys, every syntax, any case, quoted or not ---
    ("env-password-letters", "PASSWORD={alpha:14}\n"),
    ("env-password-lower", "password={lower:12}\n"),
    ("env-db-pass", "export DB_PASS={alnum:16}\n"),
    ("env-mysql-root-password", "MYSQL_ROOT_PASSWORD={alpha:10}\n"),
    ("env-passwd", "passwd={alnum:10}\n"),
    ("yaml-pwd", "  pwd: {alnum:10}\n"),
    ("yaml-password-letters", "database:\n  password: {alpha:12}\n"),
    ("yaml-password-quoted", "password: '{pw:14}'\n"),
    ("json-password", '{"user": "svc", "password": "{pw:16}"}'),
    ("json-Password-dotnet", '{"ConnectionStrings": {}, "Password": "{pw:12}"}'),
    ("toml-db-password", "[db]\ndb_password = '{pw:14}'\n"),
    ("ini-password", "[database]\npassword = {alnum:12}\nhost = db\n"),
    ("ini-secret", "[auth]\nsecret={lalnum:20}\n"),
    ("yaml-secret", "secret: {alnum:24}\n"),
    ("env-secret-key-letters", "SECRET_KEY={alpha:40}\n"),
    ("python-token", 'token = "{alnum:32}"\n'),
    ("yaml-api-key", "api_key: {hex:32}\n"),
    ("env-apikey", "APIKEY={alnum:32}\n"),
    ("yaml-x-api-key", "X_API_KEY: {alnum:40}\n"),
    ("yaml-auth", "auth: {b64:28}\n"),
    ("ini-credential", "credential = {alnum:20}\n"),
    ("json-private-key-value", '"private_key": "{b64:44}"'),
    ("env-client-secret", "CLIENT_SECRET={alnum:34}\n"),
    ("yaml-client-secret", "oauth:\n  client_secret: {b64url:40}\n"),
    ("laravel-app-key", "APP_KEY=base64:{b64:43}=\n"),
    ("rails-master-key-env", "RAILS_MASTER_KEY={hex:32}\n"),
    ("rails-master-key-file", "$ cat config/master.key\n{hex:32}\n"),
    ("rails-secret-key-base", "secret_key_base: {hex:128}\n"),
    ("yaml-master-key", "master_key: {hex:32}\n"),
    ("env-master-key-spaced", "MEILI_MASTER_KEY={alnum:32}\n"),
    ("yaml-access-token", "access_token: {alnum:40}\n"),
    ("env-refresh-token", "REFRESH_TOKEN={b64url:60}\n"),
    ("yaml-session-secret", "session_secret: {alnum:30}\n"),
    ("env-encryption-key", "ENCRYPTION_KEY={hex:64}\n"),
    ("yaml-signing-key", "signing_key: {b64:44}\n"),
    ("env-webhook-secret", "GITHUB_WEBHOOK_SECRET={alnum:32}\n"),
    ("xml-password", "<server><id>nexus</id><username>deploy</username><password>{pw:14}</password></server>"),
    ("xml-apikey-element", "<apiKey>{alnum:32}</apiKey>"),
    ("dotnet-add-key", '<add key="ApiKey" value="{alnum:32}" />'),
    ("windows-set-password", "set PASSWORD={alnum:12}\n"),
    ("powershell-env-token", '$env:API_TOKEN = "{alnum:32}"\n'),
    ("ruby-hash-password", "password => '{pw:12}',\n"),
    ("php-define-db-password", "define('DB_PASSWORD', '{pw:14}');\n"),
    ("python-environ-token", 'os.environ["API_TOKEN"] = "{alnum:32}"\n'),
    ("docker-run-env", "docker run -e POSTGRES_PASSWORD={alnum:12} postgres:16\n"),
    ("docker-build-arg", "docker build --build-arg NPM_TOKEN={alnum:36} .\n"),
    ("toml-auth-token", '[auth]\ntoken = "{alnum:30}"\n'),
    ("pgpassword-env", "PGPASSWORD={alpha:10} psql -h db -U app\n"),
    ("yaml-secret-access-key", "secret_access_key: {b64:40}\n"),
    ("yaml-pass", "user: deploy\npass: {alnum:12}\n"),
    ("ansible-become-pass", "ansible_become_pass: {alnum:14}\n"),
    ("gradle-signing-password", "signing.password={alnum:14}\n"),
    ("gradle-ossrh-password", "ossrhPassword={alnum:14}\n"),
    ("npmrc-auth-token-uuid", "//registry.example.org/:_authToken={uuid:36}\n"),
    ("npmrc-auth", "_auth = {b64:32}\n"),
    ("npmrc-password", "//registry.example.org/:_password={b64:24}\n"),
    ("django-secret-key", "SECRET_KEY = 'django-insecure-{pw:50}'\n"),
    ("flask-secret-key", 'app.secret_key = "{alnum:32}"\n'),
    ("yaml-license-key", "license_key: {hex:40}\n"),
    ("env-subscription-key", "OCP_APIM_SUBSCRIPTION_KEY={hex:32}\n"),
    ("kv-colon-equals", "auth_token := \"{alnum:32}\"\n"),
    ("env-pat", "AZURE_DEVOPS_PAT={b32:52}\n"),
    ("env-uppercase-password-short", "SMTP_PASSWORD={alpha:8}\n"),
    ("yaml-password-block", "password: |\n  {pw:20}\n"),
    ("properties-password", "spring.datasource.password={alnum:12}\n"),
    ("json-escaped-password", '{\\"password\\": \\"{pw:14}\\"}'),
    # --- connection strings of every syntax ---
    ("url-postgres", "postgresql://app:{urlpw:16}@db.internal:5432/app"),
    ("url-mysql-letters", "mysql://root:{alpha:12}@localhost/db"),
    ("url-mongodb-srv", "mongodb+srv://admin:{alnum:16}@cluster0.abcde.mongodb.net/?retryWrites=true"),
    ("url-redis-empty-user", "redis://:{alnum:20}@cache:6379/0"),
    ("url-amqp", "amqp://guest:{alnum:12}@rabbit:5672/"),
    ("url-smtp", "smtp://mailer:{alnum:14}@smtp.example:587"),
    ("url-ftp", "ftp://anonymous:{alnum:10}@ftp.example/pub"),
    ("url-database-url", "DATABASE_URL=postgres://u:{alnum:20}@host/db\n"),
    ("url-query-api-key", "GET https://api.example.com/v1/items?api_key={alnum:32}&page=2"),
    ("url-query-access-token", "https://graph.example.com/me?fields=id&access_token={alnum:40}"),
    ("url-query-token", "wss://stream.example.com/ws?token={b64url:40}"),
    ("url-query-secret", "https://hooks.example.com/in?client_id=abc&client_secret={alnum:32}"),
    ("url-query-password", "https://old.example.com/login?user=bob&password={alnum:12}"),
    ("url-query-sig", "https://cdn.example.com/f.zip?expires=1&signature={hex:64}"),
    ("url-aws-presigned", "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20260101&X-Amz-Signature={hex:64}"),
    ("libpq-dsn", "host=db.internal port=5432 dbname=app user=app password={alnum:14} sslmode=require"),
    ("libpq-dsn-letters", "dbname=app password={alpha:12} host=db"),
    ("libpq-dsn-quoted", "host=db user=app password='{pw:14}' dbname=app"),
    ("adonet-password", "Server=tcp:sql.example,1433;Database=app;User ID=sa;Password={pw:16};Encrypt=True;"),
    ("adonet-pwd", "Data Source=db;Initial Catalog=x;UID=sa;Pwd={alnum:12};"),
    ("adonet-password-quoted", 'Data Source=db;User Id=sa;Password="{pw:14}";'),
    ("odbc-pwd", "DRIVER={ODBC Driver 18 for SQL Server};SERVER=db;UID=sa;PWD={alnum:14}"),
    ("pgpass-line", "db.internal:5432:app:app_user:{alnum:16}\n"),
    ("pgpass-wildcard", "*:*:*:postgres:{alpha:12}\n"),
    ("jdbc-postgres", "jdbc:postgresql://db:5432/app?user=app&password={alnum:14}&ssl=true"),
    ("jdbc-mysql", "jdbc:mysql://db:3306/app?useSSL=true&user=root&password={alnum:12}"),
    ("jdbc-sqlserver", "jdbc:sqlserver://db:1433;databaseName=app;user=sa;password={pw:14};"),
    ("jdbc-oracle-thin", "jdbc:oracle:thin:scott/{alnum:12}@db:1521/ORCL"),
    ("sqlplus-userpass", "sqlplus scott/{alnum:12}@ORCL\n"),
    ("azure-servicebus", "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey={b64:43}="),
    ("azure-storage-conn", "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={b64:86}==;EndpointSuffix=core.windows.net"),
    ("git-credentials-line", "https://bob:{alnum:20}@git.example.org\n"),
    ("url-git-oauth2", "git clone https://oauth2:{alnum:20}@gitlab.example/acme/x.git"),
    # --- command lines ---
    ("mysql-p-attached", "mysql -u root -p{alnum:12} app\n"),
    ("mysql-password-eq", "mysql --user=root --password={alnum:12}\n"),
    ("mysqldump-p-quoted", "mysqldump -uroot -p'{pw:12}' app > dump.sql\n"),
    ("sshpass-p", "sshpass -p {alnum:12} ssh deploy@host\n"),
    ("sshpass-p-attached", "sshpass -p'{pw:12}' scp a deploy@host:\n"),
    ("docker-login-p", "docker login -u bob -p {alnum:20} registry.example\n"),
    ("docker-login-password", "docker login --username bob --password {alnum:20}\n"),
    ("podman-login-p", "podman login -p {alnum:20} -u bob quay.example\n"),
    ("echo-password-stdin", "echo {alnum:20} | docker login --username bob --password-stdin\n"),
    ("curl-user", "curl -u admin:{alnum:14} https://api.example/\n"),
    ("curl-user-long", "curl --user admin:{alnum:14} https://api.example/\n"),
    ("curl-header-bearer", 'curl -H "Authorization: Bearer {alnum:40}" https://api.example/\n'),
    ("wget-password", "wget --password={alnum:12} --user=bob https://files.example/x\n"),
    ("wget-http-password", "wget --http-password {alnum:12} https://files.example/x\n"),
    ("redis-cli-a", "redis-cli -a {alnum:16} ping\n"),
    ("mongosh-password", "mongosh --username admin --password {alnum:12} mongodb://db\n"),
    ("mongo-p", "mongo -u admin -p {alnum:12} admin\n"),
    ("openssl-passin", "openssl rsa -in k.pem -passin pass:{alnum:12} -out k2.pem\n"),
    ("ldapsearch-w", "ldapsearch -x -D cn=admin,dc=example -w {alnum:12} -b dc=example\n"),
    ("flag-token-space", "deploy --token {alnum:32} --env prod\n"),
    ("flag-api-key-eq", "tool --api-key={alnum:32}\n"),
    ("flag-client-secret", "az ad sp login --client-secret {alnum:34}\n"),
    ("flag-password-space-letters", "app --password {alpha:12} --verbose\n"),
    ("keytool-storepass", "keytool -list -keystore ks.jks -storepass {alnum:12}\n"),
    ("smbclient-user-percent", "smbclient //fs/share -U bob%{alnum:12}\n"),
    ("az-login-p", "az login --service-principal -u 00000000-0000-0000-0000-000000000000 -p {alnum:34} --tenant t\n"),
    ("helm-repo-password", "helm repo add acme https://charts.example --username bob --password {alnum:16}\n"),
    ("httpie-auth", "http --auth bob:{alnum:12} https://api.example/\n"),
    ("oc-login-token", "oc login --token=sha256~{b64url:43} --server=https://api.example:6443\n"),
    ("psql-password-flag", "pg_dump --dbname=postgresql://app:{alnum:14}@db/app\n"),
    ("git-c-extraheader", 'git -c http.extraheader="AUTHORIZATION: basic {b64:32}" clone https://git.example/x\n'),
    # --- HTTP material ---
    ("header-basic", "Authorization: Basic {b64:24}\n"),
    ("header-bearer-lower", "authorization: bearer {alnum:40}\n"),
    ("header-token-upper", "AUTHORIZATION: Token {hex:40}\n"),
    ("header-bot", "Authorization: Bot {b64url:59}\n"),
    ("header-proxy-authorization", "Proxy-Authorization: Basic {b64:20}\n"),
    ("header-cookie", "Cookie: sessionid={alnum:32}; csrftoken={alnum:32}\n"),
    ("header-set-cookie", "Set-Cookie: session={b64url:40}; Path=/; HttpOnly\n"),
    ("header-set-cookie-lower", "set-cookie: _gh_sess={b64:60}; path=/; secure\n"),
    ("header-x-api-key", "X-Api-Key: {alnum:32}\n"),
    ("header-x-auth-token", "X-Auth-Token: {hex:32}\n"),
    ("header-x-vault-token", "X-Vault-Token: {alnum:26}\n"),
    ("header-x-custom-token", "x-acme-session-token: {b64url:40}\n"),
    ("header-amz-security-token", "x-amz-security-token: {b64:100}\n"),
    ("header-aws-sigv4", "Authorization: AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature={hex:64}\n"),
    ("header-apikey-scheme", "Authorization: ApiKey {b64:40}\n"),
    ("header-sharedkey", "Authorization: SharedKey acct:{b64:44}\n"),
    ("header-custom-scheme", "Authorization: Splunk {uuid:36}\n"),
    ("header-no-scheme", "Authorization: {alnum:40}\n"),
    ("header-x-auth-key", "-H 'X-Auth-Key: {hex:37}'\n"),
    ("header-api-key", "api-key: {hex:32}\n"),
    ("header-subscription-key", "Ocp-Apim-Subscription-Key: {hex:32}\n"),
    ("header-json", '{"headers": {"Authorization": "Bearer {alnum:40}"}}'),
    ("python-headers-dict", "headers = {'X-API-KEY': '{alnum:32}'}\n"),
    ("python-auth-tuple", 'requests.get(url, auth=("admin", "{pw:12}"))\n'),
    ("python-auth-tuple-letters", "session.auth = ('deploy', '{alpha:12}')\n"),
    ("python-httpbasicauth", 'HTTPBasicAuth("admin", "{alnum:12}")\n'),
    ("js-basic-auth", "axios.get(u, { auth: { username: 'bob', password: '{pw:12}' } })\n"),
    ("header-digest-response", 'Authorization: Digest username="bob", realm="x", nonce="n", response="{hex:32}"\n'),
    # --- key blocks, whole, every armour ---
    ("pem-rsa", "-----BEGIN RSA PRIVATE KEY-----\n" + PEM_BODY + "\n-----END RSA PRIVATE KEY-----\n"),
    ("pem-pkcs8", "-----BEGIN PRIVATE KEY-----\n" + PEM_BODY + "\n-----END PRIVATE KEY-----\n"),
    ("pem-encrypted-pkcs8", "-----BEGIN ENCRYPTED PRIVATE KEY-----\n" + PEM_BODY + "\n-----END ENCRYPTED PRIVATE KEY-----\n"),
    ("pem-legacy-encrypted", "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,{HEX:32}\n\n" + PEM_BODY + "\n-----END RSA PRIVATE KEY-----\n"),
    ("pem-ec", "-----BEGIN EC PRIVATE KEY-----\n{b64:64}\n{b64:56}==\n-----END EC PRIVATE KEY-----\n"),
    ("pem-dsa", "-----BEGIN DSA PRIVATE KEY-----\n" + PEM_BODY + "\n-----END DSA PRIVATE KEY-----\n"),
    ("openssh-key", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n{b64:70}\n{b64:70}\n{b64:32}=\n-----END OPENSSH PRIVATE KEY-----\n"),
    ("pgp-private-block", "-----BEGIN PGP PRIVATE KEY BLOCK-----\nComment: GPGTools\n\n" + PEM_BODY + "\n={b64:4}\n-----END PGP PRIVATE KEY BLOCK-----\n"),
    ("ssh2-encrypted", "---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nComment: \"rsa-key\"\n" + PEM_BODY + "\n---- END SSH2 ENCRYPTED PRIVATE KEY ----\n"),
    ("putty-ppk-v3", "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: eddsa-key-20260101\nPublic-Lines: 2\nAAAAC3NzaC1lZDI1NTE5AAAAI{b64:30}\n{b64:20}\nPrivate-Lines: 1\n{b64:44}\nPrivate-MAC: {hex:64}\n"),
    ("putty-ppk-v2-encrypted", "PuTTY-User-Key-File-2: ssh-rsa\nEncryption: aes256-cbc\nComment: imported-openssh-key\nPublic-Lines: 1\nAAAAB3NzaC1yc2E{b64:40}\nPrivate-Lines: 3\n{b64:64}\n{b64:64}\n{b64:40}\nPrivate-MAC: {hex:40}\n"),
    ("putty-ppk-v3-argon", "PuTTY-User-Key-File-3: ecdsa-sha2-nistp256\nEncryption: aes256-cbc\nComment: k\nPublic-Lines: 1\nAAAAE2VjZHNh{b64:40}\nKey-Derivation: Argon2id\nArgon2-Memory: 8192\nArgon2-Passes: 13\nArgon2-Parallelism: 1\nArgon2-Salt: {hex:32}\nPrivate-Lines: 1\n{b64:64}\nPrivate-MAC: {hex:64}\n"),
    ("json-service-account-private-key", '{"type": "service_account", "private_key_id": "{hex:40}", "private_key": "-----BEGIN PRIVATE KEY-----\\n{b64:64}\\n{b64:64}\\n-----END PRIVATE KEY-----\\n", "client_email": "x@p.iam.gserviceaccount.com"}'),
    ("age-identity", "AGE-SECRET-KEY-1{ualnum:58}\n"),
    # --- Kubernetes and framework secrets ---
    ("k8s-secret-data", "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\ntype: Opaque\ndata:\n  username: YWRtaW4=\n  password: {b64:20}\n  api-key: {b64:44}\n"),
    ("k8s-secret-stringdata", "apiVersion: v1\nkind: Secret\nmetadata:\n  name: app\nstringData:\n  DB_URL: postgres://app@db/app\n  token: {alnum:9}\n  admin: {alpha:10}\n"),
    ("k8s-secret-json", '{"apiVersion": "v1", "kind": "Secret", "data": {"tls.key": "{b64:60}", "username": "{b64:12}"}}'),
    ("k8s-secret-flat-log", "applied kind: Secret stringData: token: {alnum:12} admin: {alpha:10}"),
    ("kubeconfig-client-key-data", "users:\n- name: admin\n  user:\n    client-certificate-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t\n    client-key-data: {b64:200}\n"),
    ("kubeconfig-token", "users:\n- name: sa\n  user:\n    token: {b64url:40}\n"),
    ("kubeadm-join-token", "kubeadm join 10.0.0.1:6443 --token {lalnum:6}.{lalnum:16} --discovery-token-ca-cert-hash sha256:{hex_pub:64}\n"),
    ("kubeadm-token-create", "$ kubeadm token create\n{lalnum:6}.{lalnum:16}\n"),
    ("bootstrap-token-secret", "  token-id: {lalnum:6}\n  token-secret: {lalnum:16}\n"),
    ("docker-config-auth", '{"auths": {"registry.example": {"auth": "{b64:24}"}}}'),
    ("docker-config-identitytoken", '{"auths": {"r.example": {"identitytoken": "{b64url:40}"}}}'),
    ("htpasswd-apr1", "bob:$apr1${alnum:8}${b64:22}\n"),
    ("bcrypt-hash", "password_hash: $2b$12${b64:53}\n"),
    ("shadow-sha512", "root:$6${alnum:16}${b64:86}:19000:0:99999:7:::\n"),
    ("netrc-inline", "machine api.example login bob password {alnum:14}\n"),
    ("terraform-tfvars", 'db_password = "{pw:16}"\n'),
    ("github-actions-env", "env:\n  NPM_TOKEN: {alnum:36}\n"),
    # --- vendor tokens by documented prefix ---
    ("google-oauth-access", "ya29.{b64url:150}"),
    ("google-oauth-refresh", "refresh: 1//0{b64url:100}"),
    ("google-client-secret", "GOCSPX-{b64url:28}"),
    ("google-api-key", "AIza{b64url:35}"),
    ("firebase-fcm-server-key", "AAAA{b64url:7}:APA91b{b64url:134}"),
    ("azure-devops-pat-new", "{alnum:52}AZDO{alnum:4}"),
    ("azure-devops-pat-url", "https://{b32:52}@dev.azure.com/org/proj/_git/repo"),
    ("bitbucket-app-password", "ATBB{alnum:28}{HEX:8}"),
    ("bitbucket-repo-token", "ATCTT3xFfGN0{b64url:180}={HEX:8}"),
    ("atlassian-api-token", "ATATT3xFfGF0{b64url:180}={HEX:8}"),
    ("square-access-token", "EAAA{b64url:60}"),
    ("square-oauth-secret", "sq0csp-{b64url:43}"),
    ("supabase-pat", "sbp_{hex:40}"),
    ("supabase-secret-key", "sb_secret_{b64url:31}"),
    ("linear-api-key", "lin_api_{alnum:40}"),
    ("linear-oauth", "lin_oauth_{hex:64}"),
    ("render-api-key", "rnd_{alnum:32}"),
    ("sonar-user-token", "squ_{hex:40}"),
    ("sonar-project-token", "sqp_{hex:40}"),
    ("sonar-analysis-token", "sqa_{hex:40}"),
    ("circleci-pat", "CCIPAT_{alnum:22}_{hex:40}"),
    ("circleci-project-token", "CCIPRJ_{alnum:22}_{hex:40}"),
    ("buildkite-token", "bkua_{hex:40}"),
    ("gitlab-ci-build-token", "glcbt-{b64url:20}"),
    ("gitlab-pat-routable", "glpat-{b64url:27}.01.{lalnum:9}"),
    ("gitlab-deploy-token", "gldt-{b64url:20}"),
    ("doppler-service-token", "dp.st.prd.{alnum:43}"),
    ("doppler-personal-token", "dp.pt.{alnum:43}"),
    ("vault-service-token", "hvs.{b64url:90}"),
    ("terraform-cloud-token", "{alnum:14}.atlasv1.{alnum:67}"),
    ("bitwarden-access-token", "0.{uuid:36}.{alnum:30}:{alnum:22}=="),
    ("onepassword-service-account", "ops_eyJ{b64url:200}"),
    ("planetscale-token", "pscale_tkn_{b64url:43}"),
    ("planetscale-password", "pscale_pw_{b64url:43}"),
    ("neon-api-key", "napi_{lalnum:64}"),
    ("aiven-password", "AVNS_{b64url:20}"),
    ("databricks-token", "dapi{hex:32}"),
    ("testpypi-token", "pypi-AgENdGVzdC5weXBpLm9yZw{b64url:120}"),
    ("pypi-token", "pypi-AgEIcHlwaS5vcmc{b64url:120}"),
    ("npm-token", "npm_{alnum:36}"),
    ("rubygems-token", "rubygems_{hex:48}"),
    ("nuget-api-key", "oy2{lalnum:43}"),
    ("crates-io-token", "cio{alnum:32}"),
    ("packagist-token", "packagist_uat_{alnum:60}"),
    ("clojars-token", "CLOJARS_{lalnum:60}"),
    ("grafana-service-account", "glsa_{alnum:32}_{hex:8}"),
    ("grafana-cloud-token", "glc_eyJ{b64url:100}"),
    ("sentry-user-token", "sntryu_{hex:64}"),
    ("sentry-org-token", "sntrys_eyJpYXQiO{b64url:60}_{b64url:43}"),
    ("postman-api-key", "PMAK-{hex:24}-{hex:34}"),
    ("pulumi-token", "pul-{hex:40}"),
    ("netlify-pat", "nfp_{alnum:36}"),
    ("flyio-token", "fo1_{b64url:43}"),
    ("heroku-v2", "HRKU-AA{b64url:58}"),
    ("digitalocean-pat", "dop_v1_{hex:64}"),
    ("groq-key", "gsk_{alnum:52}"),
    ("replicate-token", "r8_{alnum:37}"),
    ("xai-key", "xai-{alnum:80}"),
    ("tavily-key", "tvly-{alnum:32}"),
    ("langsmith-key", "lsv2_pt_{hex:32}_{hex:10}"),
    ("pinecone-key", "pcsk_{alnum:6}_{alnum:60}"),
    ("openrouter-key", "sk-or-v1-{hex:64}"),
    ("stripe-webhook-secret", "whsec_{alnum:32}"),
    ("firecrawl-key", "FIRECRAWL: fc-{hex:32}"),
    ("stripe-restricted", "rk_live_{alnum:99}"),
    ("shopify-token", "shpat_{hex:32}"),
    ("twilio-api-key", "SK{hex:32}"),
    ("sendgrid-key", "SG.{b64url:22}.{b64url:43}"),
    ("mailchimp-key", "{hex:32}-us12"),
    ("notion-secret", "secret_{alnum:43}"),
    ("notion-ntn", "ntn_{digit:11}{alnum:35}"),
    ("airtable-pat", "pat{alnum:14}.{hex:64}"),
    ("figma-token", "figd_{b64url:40}"),
    ("tailscale-authkey", "tskey-auth-{alnum:17}-{alnum:33}"),
    ("slack-refresh", "xoxe-1-{alnum:140}"),
    ("openshift-token", "sha256~{b64url:43}"),
    ("azure-ad-client-secret", "Abc8Q~{b64url:31}"),
    ("dynatrace-token", "dt0c01.{ualnum:24}.{ualnum:64}"),
    ("prefect-key", "pnu_{alnum:36}"),
    ("harness-pat", "pat.{b64url:22}.{hex:24}.{alnum:20}"),
    ("octopus-key", "API-{ualnum:26}"),
    ("age-key-lower", "age-secret-key-1{lalnum:58}"),
)


@cache
def structural() -> tuple[Sample, ...]:
    """The hand-written templates, filled (``[[b64:...]]`` sections encoded)."""
    out = []
    for fid, template in TEMPLATES + BLOBS:
        text, parts = _blob(fid, template) if "[[b64:" in template else _fill(fid, template)
        out.append(Sample(id=f"s31-{fid}", what=fid, before="", secret=text, after="", random_parts=parts))
    return tuple(out)


#: Base64 blobs whose decoded form is a credential (a whole service-account JSON, a docker config, a key).
BLOBS: tuple[tuple[str, str], ...] = (
    ("b64-service-account", 'GOOGLE_CREDENTIALS=[[b64:{"type": "service_account", "project_id": "p", "private_key_id": "{hex:40}", "private_key": "-----BEGIN PRIVATE KEY-----\\n{b64:64}\\n-----END PRIVATE KEY-----\\n", "client_email": "a@p.iam.gserviceaccount.com"}]]\n'),
    ("b64-dockerconfigjson", '.dockerconfigjson: [[b64:{"auths":{"ghcr.io":{"username":"bob","password":"{alnum:20}","auth":"{b64:24}"}}}]]\n'),
    ("b64-docker-auth-userpass", '"auth": "[[b64:bob:{alnum:16}]]"'),
    ("b64-pem-key", "tls.key: [[b64:-----BEGIN RSA PRIVATE KEY-----\n{b64:64}\n{b64:64}\n-----END RSA PRIVATE KEY-----\n]]\n"),
    ("b64-env-file", "blob: [[b64:DB_PASSWORD={alnum:14}\nAPI_TOKEN={alnum:32}\n]]\n"),
    ("b64-json-client-secret", 'CONFIG=[[b64:{"client_id": "abc", "client_secret": "{alnum:32}"}]]'),
)


# --- samples generated from the rules' own patterns -----------------------------------------------

_SAFE = string.ascii_letters + string.digits


def _class_chars(items: list[tuple[Any, Any]]) -> list[str]:
    chars: set[str] = set()
    negate = False
    for op, av in items:
        name = str(op)
        if name == "NEGATE":
            negate = True
        elif name == "LITERAL":
            chars.add(chr(av))
        elif name == "RANGE":
            chars |= {chr(c) for c in range(av[0], min(av[1], av[0] + 200) + 1)}
        elif name == "CATEGORY":
            cat = str(av)
            chars |= set({"CATEGORY_DIGIT": string.digits, "CATEGORY_WORD": _SAFE + "_",
                          "CATEGORY_SPACE": " "}.get(cat, ""))
    if negate:
        return [c for c in _SAFE if c not in chars] or [c for c in " ;,:" if c not in chars] or ["~"]
    printable = [c for c in chars if c.isprintable() and c not in "[]"]
    return printable or [" "]


def _gen(parsed: Any, rng: random.Random, groups: dict[int, tuple[int, int]], out: list[str], in_secret: bool) -> None:
    for op, av in parsed:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(av))
        elif name == "NOT_LITERAL":
            out.append(rng.choice([c for c in _SAFE if c != chr(av)]))
        elif name == "IN":
            out.append(rng.choice(sorted(_class_chars(av))))
        elif name == "ANY":  # gitleaks' patterns use an unescaped '.' for a literal dot (hooks.slack.com)
            out.append(".")
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = av
            high = low + 40 if high == sre.MAXREPEAT else high
            count = rng.randint(low, min(high, low + 24)) if in_secret else max(low, min(1, high))
            for _ in range(count):
                _gen(sub, rng, groups, out, in_secret)
        elif name == "SUBPATTERN":
            gid, _, _, sub = av
            start = len("".join(out))
            _gen(sub, rng, groups, out, in_secret or gid is not None)
            if gid is not None:
                groups[gid] = (start, len("".join(out)))
        elif name == "BRANCH":
            _gen(av[1][0], rng, groups, out, in_secret)
        elif name == "CATEGORY":
            out.append({"CATEGORY_DIGIT": rng.choice(string.digits), "CATEGORY_SPACE": " "}.get(str(av), rng.choice(_SAFE)))
        elif name == "GROUPREF":
            start, end = groups.get(av, (0, 0))
            out.append("".join(out)[start:end])
        # AT (anchors), ASSERT / ASSERT_NOT (lookarounds): nothing to emit


def _sample_for(rule: Any, seed: int) -> tuple[str, str] | None:
    """A string the rule's pattern matches, and the part of it that is the secret; None if none found."""
    rng = random.Random(f"corpus31-rule/{rule.id}/{seed}")
    try:
        parsed = sre.parse(rule.pattern.pattern, rule.pattern.flags)
    except Exception:  # noqa: BLE001 - a pattern the generator cannot walk is simply not sampled
        return None
    out: list[str] = []
    _gen(parsed, rng, {}, out, False)
    text = "".join(out)
    match = rule.pattern.search(text)
    if match is None:
        return None
    span = rule.secret_span(match)
    if span is None:
        return None
    return text, text[span[0] : span[1]]


@cache
def from_rules() -> tuple[Sample, ...]:
    """One sample per gitleaks rule (those the generator can satisfy), as `key = value` prose."""
    out = []
    for rule in redact_module.shared().rules:
        if rule.secret_group is None or "private-key" in rule.id:
            continue  # ours, and key blocks: covered by the templates above, in every armour
        for seed in range(12):
            found = _sample_for(rule, seed)
            if found is None:
                continue
            text, secret = found
            if not any(k in text.lower() for k in rule.keywords):
                # gitleaks' keyword is the vendor's name beside the token (airtable, facebook): say it
                text = f"{rule.keywords[0]} = {text}"
            # the random runs only: a literal of the pattern (the "rubygems" of rubygems_…) is no secret
            parts = tuple(run for run in re.findall(r"[A-Za-z0-9]{8,}", secret)
                          if run.lower() not in rule.pattern.pattern.lower())
            if not parts:
                continue
            out.append(Sample(id=f"g31-{rule.id}", what=rule.id, before="config: ", secret=text, after=" (end)",
                              random_parts=parts))
            break
    return tuple(out)


@cache
def full() -> tuple[Sample, ...]:
    """Every format: the structural templates, the rule-generated samples and the hand-written corpus."""
    return structural() + from_rules() + corpus()


def dump() -> str:
    """For debugging: the corpus as JSON lines."""
    return "\n".join(json.dumps({"id": s.id, "text": s.text}) for s in full())
