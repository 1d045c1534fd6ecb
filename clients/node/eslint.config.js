// ESLint over this package and the Node client example. Paths are from the repository root:
// run it there, as scripts/lint.sh and `npm run lint` do (eslint --config clients/node/eslint.config.js).
import js from '@eslint/js';
import globals from 'globals';

export default [
  js.configs.recommended,
  {
    files: ['clients/node/**/*.js', 'clients/node/**/*.mjs'],
    languageOptions: { ecmaVersion: 2023, sourceType: 'module', globals: globals.node },
    // Express tells an error handler by its four parameters: the one it does not use is _next.
    rules: { 'no-unused-vars': ['error', { argsIgnorePattern: '^_' }] },
  },
  {
    files: ['examples/clients/node/**/*.js'],
    languageOptions: { ecmaVersion: 2023, sourceType: 'commonjs', globals: globals.node },
  },
];
