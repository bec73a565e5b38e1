import { defineConfig } from 'vitest/config';

// Unit tests run in Node with @cloudflare/sandbox mocked (vi.mock in each test
// file, see test/fake-sdk.ts): the SDK only runs inside workerd, and
// @cloudflare/vitest-pool-workers cannot run containers.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    environment: 'node',
    testTimeout: 20_000,
    restoreMocks: false,
  },
});
