// ESLint (flat config) with typescript-eslint's strict, type-checked rules.
import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["dist/", "build/", "node_modules/", "eslint.config.js"] },
  js.configs.recommended,
  tseslint.configs.strictTypeChecked,
  tseslint.configs.stylisticTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      // Template literals of numbers and booleans are fine; of objects they are not.
      "@typescript-eslint/restrict-template-expressions": ["error", { allowNumber: true, allowBoolean: true }],
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
    },
  },
  {
    files: ["test/**/*.ts", "bench/**/*.ts"],
    rules: {
      // Tests assert on shapes they just decoded.
      "@typescript-eslint/no-non-null-assertion": "off",
      // Streaming handlers written as users write them: `async function*` that need not await.
      "@typescript-eslint/require-await": "off",
      // node:test's `test()` returns a promise the runner itself awaits.
      "@typescript-eslint/no-floating-promises": [
        "error",
        { allowForKnownSafeCalls: [{ from: "package", name: ["test", "describe", "it", "suite"], package: "node:test" }] },
      ],
    },
  },
);
