// ESLint: typescript-eslint's recommended rules, type-aware for the product code (src/), where
// floating promises and unsafe `any` flows matter most; syntax-level for tests, bench and examples.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/**', 'build/**', 'node_modules/**', 'clients/python/**', 'helm/**', 'coverage/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['src/**/*.ts'],
    extends: [...tseslint.configs.recommendedTypeChecked],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      // Promises on the hot path are fired on purpose with `void`; everything else must be awaited or handled.
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: { arguments: false } }],
      // Values come from JSON on the wire; narrowing them is done by hand, where it is checked.
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      // Lifecycle methods and client callbacks are async by contract (Component.start, kafkajs
      // handlers); a body that needs no await is still right there.
      '@typescript-eslint/require-await': 'off',
      '@typescript-eslint/restrict-template-expressions': ['error', { allowNumber: true, allowBoolean: true, allowNullish: true }],
    },
  },
  {
    files: ['**/*.js', '**/*.cjs', '**/*.mjs'],
    languageOptions: {
      globals: {
        require: 'readonly',
        module: 'writable',
        process: 'readonly',
        __dirname: 'readonly',
        console: 'readonly',
        Buffer: 'readonly',
        setTimeout: 'readonly',
        clearTimeout: 'readonly',
        setInterval: 'readonly',
        clearInterval: 'readonly',
        performance: 'readonly',
        fetch: 'readonly',
        URL: 'readonly',
        global: 'readonly',
        setImmediate: 'readonly',
        AbortSignal: 'readonly',
      },
    },
    rules: { '@typescript-eslint/no-require-imports': 'off' },
  },
  {
    // A call's way: no object literal that starts with a spread and then adds members. In Node
    // 20's V8 each such object gets a map of its own (~3-20 µs an object); `extend()` in
    // src/model/extend.ts builds the same object (bench/README.md, "Changed on 2026-11-29").
    files: ['src/formats/**/*.ts', 'src/processors/**/*.ts', 'src/pipeline/**/*.ts', 'src/exporters/**/*.ts', 'src/journal/**/*.ts', 'src/receivers/**/*.ts'],
    rules: {
      'no-restricted-syntax': [
        'error',
        {
          selector: 'ObjectExpression > SpreadElement:first-child + *',
          message: 'An object literal starting with a spread and adding members is slow in V8 (a map per object): use extend() from src/model/extend.ts.',
        },
      ],
    },
  },
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
    },
  },
);
