// A real OpenID provider for the OIDC tests: panva's oidc-provider (OpenID
// Certified), issuing JWT access tokens (RFC 9068) with the client
// credentials grant, for the resource (RFC 8707) a client names. testkit
// (`agent_reach_testkit::oidc::OidcProvider`) starts it on a loopback port:
//
//   PORT=N OIDC_CLIENTS='[{"client_id", "client_secret", "alg"?, "ttl_s"?, "claims"?}]' node provider.mjs
//
// The issuer is http://127.0.0.1:N. Each client's tokens are signed with its
// `alg` (RS256 unless named; ES256, EdDSA), live `ttl_s` seconds (default
// 300), and carry its extra `claims` (groups, tenant, ...). The provider
// prints `ready` once it listens.
//
// Test-only admin route (loopback, never part of a real provider):
//   POST /testkit/rotate[?retire=1]  new keys (new kids) sign from now on; the
//   previous keys stay published unless `retire=1`. Answers {"kids": [...]}.

import * as crypto from 'node:crypto';
import * as http from 'node:http';

import Provider from 'oidc-provider';

const port = Number(process.env.PORT);
if (!Number.isInteger(port) || port <= 0) {
  console.error('PORT must name the port to listen on');
  process.exit(2);
}
const issuer = `http://127.0.0.1:${port}`;
const clients = JSON.parse(process.env.OIDC_CLIENTS ?? '[]');
const byId = new Map(clients.map((client) => [client.client_id, client]));

let generation = 0;

/** One signing key of each kind, with kids naming their generation. */
function newKeys() {
  generation += 1;
  const jwk = (privateKey, kid) => ({ ...privateKey.export({ format: 'jwk' }), kid, use: 'sig' });
  return [
    jwk(crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey, `rsa-${generation}`),
    jwk(crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey, `ec-${generation}`),
    jwk(crypto.generateKeyPairSync('ed25519').privateKey, `ed-${generation}`),
  ];
}

function provider(keys) {
  const configuration = {
    clients: clients.map((client) => ({
      client_id: client.client_id,
      client_secret: client.client_secret,
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
    })),
    jwks: { keys },
    features: {
      clientCredentials: { enabled: true },
      devInteractions: { enabled: false },
      resourceIndicators: {
        enabled: true,
        // Any resource the client names: the tests ask for the router's URL, or another one.
        getResourceServerInfo(_ctx, resource, client) {
          const spec = byId.get(client.clientId) ?? {};
          return {
            scope: 'agents',
            audience: resource,
            accessTokenTTL: spec.ttl_s ?? 300,
            accessTokenFormat: 'jwt',
            jwt: { sign: { alg: spec.alg ?? 'RS256' } },
          };
        },
      },
    },
    async extraTokenClaims(_ctx, token) {
      return byId.get(token.clientId)?.claims;
    },
  };
  const created = new Provider(issuer, configuration);
  // The provider's own warnings about development defaults are not the tests' business.
  created.on('server_error', (_ctx, error) => console.error('server_error', error));
  return created;
}

let keys = newKeys();
let current = provider(keys).callback();

const server = http.createServer((request, response) => {
  const url = new URL(request.url, issuer);
  if (url.pathname === '/testkit/rotate' && request.method === 'POST') {
    const fresh = newKeys();
    keys = url.searchParams.get('retire') === '1' ? fresh : [...fresh, ...keys];
    current = provider(keys).callback();
    const body = JSON.stringify({ kids: keys.map((key) => key.kid) });
    response.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    response.end(body);
    return;
  }
  current(request, response);
});

server.listen(port, '127.0.0.1', () => {
  console.log('ready');
});
