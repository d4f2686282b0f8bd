// Type declarations of weft.js, for plugins written in TypeScript: compile them with `tsc`
// (ES modules) and give componentize-js the JavaScript it writes.

/** A node failure: `code` is snake_case and machine-readable, `message` is for people. */
export declare class NodeError extends Error {
  constructor(code: string, message: string);
  readonly code: string;
}

/** A declared input: build it with `input.*`. */
export interface InputDecl<T> {
  readonly typeName: string;
  readonly required: boolean;
  readonly default?: T;
  /** Phantom: the type `run` receives. */
  readonly __value?: T;
}

/** Options of an input declaration. */
export interface InputOptions<T> {
  default?: T;
  required?: boolean;
  min?: number;
  max?: number;
  step?: number;
  multiline?: boolean;
  tooltip?: string;
}

/** A host-held value (image, mask, latent, audio, model ...). */
export type Handle = object;

export declare const input: {
  int(options?: InputOptions<number>): InputDecl<number>;
  float(options?: InputOptions<number>): InputDecl<number>;
  boolean(options?: InputOptions<boolean>): InputDecl<boolean>;
  string(options?: InputOptions<string>): InputDecl<string>;
  combo<const C extends string>(choices: readonly C[], options?: InputOptions<C>): InputDecl<C>;
  image(options?: InputOptions<never>): InputDecl<Handle>;
  mask(options?: InputOptions<never>): InputDecl<Handle>;
  of(typeName: string, options?: InputOptions<never>): InputDecl<Handle>;
};

/** A declared output: build it with `output.*`. */
export interface OutputDecl {
  readonly typeName: string;
  readonly name: string;
  readonly isList: boolean;
  readonly tooltip?: string;
}

/** Options of an output declaration. */
export interface OutputOptions {
  isList?: boolean;
  tooltip?: string;
}

export declare const output: {
  int(name?: string, options?: OutputOptions): OutputDecl;
  float(name?: string, options?: OutputOptions): OutputDecl;
  boolean(name?: string, options?: OutputOptions): OutputDecl;
  string(name?: string, options?: OutputOptions): OutputDecl;
  image(name?: string, options?: OutputOptions): OutputDecl;
  of(typeName: string, name?: string, options?: OutputOptions): OutputDecl;
};

/** What `run` may call while it runs. */
export interface Context {
  progress(step: number, steps: number, message?: string): void;
  isCanceled(): boolean;
}

/** The values `run` receives for inputs `I`. */
export type Values<I> = { [K in keyof I]: I[K] extends InputDecl<infer T> ? T : never };

/** A node declaration. */
export interface NodeDeclaration<I extends Record<string, InputDecl<unknown>>> {
  classType: string;
  displayName?: string;
  category?: string;
  description?: string;
  inputs?: I;
  outputs?: OutputDecl[];
  deterministic?: boolean;
  run(values: Values<I>, ctx: Context): unknown[] | unknown;
}

/** A declared node class, for `plugin`. */
export interface Node {
  readonly classType: string;
}

export declare function node<I extends Record<string, InputDecl<unknown>>>(declaration: NodeDeclaration<I>): Node;

/** The `describe` and `execute` exports of the `plugin` world. */
export declare function plugin(
  nodes: Node[],
  host?: { progress(step: number, steps: number, message?: string): void; isCanceled(): boolean },
): { describe(): unknown[]; execute(classType: string, inputs: unknown[]): unknown };
