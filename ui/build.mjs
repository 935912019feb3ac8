// Builds the viewer (docs/operations.md#the-viewer) into dist/ui: the page, its one script (the
// sources in ui/src bundled with preact by esbuild) and its stylesheet. Run by `npm run build`;
// the sidecar serves these files as they are and fetches nothing else.
import { build } from 'esbuild';
import { copyFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const out = path.join(here, '..', 'dist', 'ui');
mkdirSync(out, { recursive: true });
await build({
  entryPoints: [path.join(here, 'src', 'main.ts')],
  bundle: true,
  minify: true,
  format: 'iife',
  target: 'es2020',
  outfile: path.join(out, 'app.js'),
  legalComments: 'none',
  logLevel: 'warning',
});
copyFileSync(path.join(here, 'index.html'), path.join(out, 'index.html'));
copyFileSync(path.join(here, 'src', 'app.css'), path.join(out, 'app.css'));
