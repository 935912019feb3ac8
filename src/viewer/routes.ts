import { existsSync, readFileSync } from 'node:fs';
import type http from 'node:http';
import path from 'node:path';
import { bearerAuth } from '../security/auth';
import type { Viewer } from './viewer';

/**
 * The viewer's routes on the telemetry port (docs/operations.md#the-viewer): the page and its
 * assets under `/ui` (built by `npm run build` into dist/ui; nothing is fetched from elsewhere, and
 * the page's content security policy forbids it), and its data under `/ui/api/`. With
 * `service.api_token` set, every one needs the token: as `Authorization: Bearer`, or the cookie
 * `/ui?token=<token>` sets once (then redirects, so the token leaves the address bar).
 */

const COOKIE = 'lightning_ui';

const SECURITY_HEADERS = {
  'content-security-policy':
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
};

const ASSETS: Record<string, { file: string; type: string }> = {
  '/ui': { file: 'index.html', type: 'text/html; charset=utf-8' },
  '/ui/': { file: 'index.html', type: 'text/html; charset=utf-8' },
  '/ui/app.js': { file: 'app.js', type: 'text/javascript; charset=utf-8' },
  '/ui/app.css': { file: 'app.css', type: 'text/css; charset=utf-8' },
};

/** dist/ui: beside the compiled viewer (dist/viewer), or from the sources' tree (tests run src/). */
function assetsDir(): string | null {
  for (const dir of [path.resolve(__dirname, '../ui'), path.resolve(__dirname, '../../dist/ui')]) if (existsSync(path.join(dir, 'index.html'))) return dir;
  return null;
}

export function createViewerRoutes(viewer: Viewer, apiToken: string | undefined): (req: http.IncomingMessage, res: http.ServerResponse) => boolean {
  const allowed = bearerAuth(apiToken);
  const cache = new Map<string, Buffer>();
  const asset = (file: string): Buffer | null => {
    let bytes = cache.get(file);
    if (bytes) return bytes;
    const dir = assetsDir();
    if (dir === null) return null;
    bytes = readFileSync(path.join(dir, file));
    cache.set(file, bytes);
    return bytes;
  };
  return (req, res) => {
    const url = new URL(req.url ?? '/', 'http://viewer');
    const p = url.pathname;
    if (p !== '/ui' && !p.startsWith('/ui/')) return false;
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' }).end('method not allowed\n');
      return true;
    }
    const token = url.searchParams.get('token');
    if (apiToken && token !== null && (p === '/ui' || p === '/ui/')) {
      if (!allowed(`Bearer ${token}`)) return deny(res);
      // HttpOnly: the page's script never sees it; Strict: no other site's page sends it.
      res.writeHead(303, { location: '/ui', 'set-cookie': `${COOKIE}=${encodeURIComponent(token)}; Path=/ui; HttpOnly; SameSite=Strict` }).end();
      return true;
    }
    if (apiToken && !allowed(req.headers.authorization, cookieOf(req.headers.cookie))) return deny(res);
    viewer.looked();
    const a = ASSETS[p];
    if (a) {
      const bytes = asset(a.file);
      if (bytes === null) {
        res.writeHead(503, { 'content-type': 'text/plain' }).end('the viewer is not built: run `npm run build` (it writes dist/ui)\n');
        return true;
      }
      res.writeHead(200, { ...SECURITY_HEADERS, 'content-type': a.type, 'content-length': String(bytes.length), 'cache-control': 'no-cache' }).end(bytes);
      return true;
    }
    void api(viewer, p, url.searchParams, res);
    return true;
  };
}

async function api(viewer: Viewer, p: string, q: URLSearchParams, res: http.ServerResponse): Promise<void> {
  const json = (status: number, body: string | Buffer): void => {
    res.writeHead(status, { ...SECURITY_HEADERS, 'content-type': 'application/json', 'cache-control': 'no-store' }).end(body);
  };
  try {
    if (p === '/ui/api/now') {
      const filter = {
        rollout: q.get('rollout') ?? undefined,
        group: q.get('group') ?? undefined,
        agent: q.get('agent') ?? undefined,
        status: q.get('status') ?? undefined,
      };
      return json(200, JSON.stringify(await viewer.now_(filter)));
    }
    if (p === '/ui/api/trajectory') {
      const t = viewer.trajectory(q.get('id') ?? '');
      return t === null
        ? json(404, JSON.stringify({ error: { message: 'no such trajectory among the recently closed episodes the viewer keeps' } }))
        : json(200, t);
    }
    if (p === '/ui/api/group') return json(200, JSON.stringify(viewer.group(q.get('id') ?? '')));
    json(404, JSON.stringify({ error: { message: `no viewer route ${p}` } }));
  } catch (err) {
    json(500, JSON.stringify({ error: { message: (err as Error).message } }));
  }
}

/** 401, and the route is taken. */
function deny(res: http.ServerResponse): true {
  res
    .writeHead(401, { 'content-type': 'text/plain; charset=utf-8', 'www-authenticate': 'Bearer' })
    .end('the viewer needs service.api_token: open /ui?token=<token> once (it sets a cookie), or send Authorization: Bearer <token>\n');
  return true;
}

function cookieOf(header: string | undefined): string | undefined {
  if (!header) return undefined;
  for (const part of header.split(';')) {
    const [k, ...v] = part.trim().split('=');
    if (k === COOKIE) return decodeURIComponent(v.join('='));
  }
  return undefined;
}
