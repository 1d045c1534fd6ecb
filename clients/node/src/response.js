// How a handler's response is stored with idem_complete and sent again on replay, byte for byte.
//
// A JSON body (an object, array, number... or text with a JSON Content-Type) is stored as jsonb and
// sent as jsonb prints it, the first time and on every replay. Any other text is stored as a jsonb
// string and sent as that text. Content-Type is always stored, so a replay knows which it was.

const JSON_TYPE = /^application\/([a-z0-9.+-]*\+)?json\s*(;|$)/i;

export const DEFAULT_REPLAY_HEADERS = ['Location', 'Content-Type'];

function headerValue(headers, name) {
  const lower = name.toLowerCase();
  for (const [k, v] of Object.entries(headers)) if (k.toLowerCase() === lower) return [k, v];
  return undefined;
}

function isJsonText(text) {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}

/**
 * A handler's { status, headers, body } made ready to store and send:
 * { status, headers (all, to send), stored (allow-listed headers), json (jsonb text to store or
 * null), text (the body to send unless the stored jsonb text replaces it), isJson }.
 */
export function prepareResponse(res, allowList = DEFAULT_REPLAY_HEADERS) {
  const status = res.status ?? 200;
  const headers = { ...(res.headers ?? {}) };
  let body = res.body;
  if (Buffer.isBuffer(body)) body = body.toString('utf8');
  let contentType = headerValue(headers, 'content-type')?.[1];
  let json = null;
  let text = '';
  let isJson = false;
  if (typeof body === 'string') {
    contentType ??= headers['Content-Type'] = 'text/plain; charset=utf-8';
    text = body;
    isJson = JSON_TYPE.test(contentType) && isJsonText(body);
    json = isJson ? body : JSON.stringify(body);
  } else if (body !== undefined && body !== null) {
    if (contentType == null) headers['Content-Type'] = 'application/json';
    text = json = JSON.stringify(body);
    isJson = true;
  }
  const stored = {};
  for (const name of new Set([...allowList, 'Content-Type'])) {
    const found = headerValue(headers, name);
    if (found) stored[name] = String(found[1]);
  }
  return { status, headers, stored, json, text, isJson };
}

/** The body to send from what was stored: jsonb text for JSON types, the string otherwise. */
export function storedBodyText(headers, bodyText) {
  if (bodyText === null || bodyText === undefined) return '';
  const contentType = headers ? headerValue(headers, 'content-type')?.[1] : undefined;
  if (contentType && JSON_TYPE.test(contentType)) return bodyText;
  const value = JSON.parse(bodyText);
  return typeof value === 'string' ? value : bodyText;
}
