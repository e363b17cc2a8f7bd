// The bearer token: asked for once when the API answers 401, kept in sessionStorage
// (this tab only), sent by api.js on every request, streams included.

const KEY = "dagq.token";
let asking = null;

export function token() {
  return sessionStorage.getItem(KEY);
}

export function forgetToken() {
  sessionStorage.removeItem(KEY);
  showSignOut();
}

export function showSignOut() {
  const button = document.getElementById("sign-out");
  if (button) button.hidden = !token();
}

/** Asks for a token (one dialog however many requests were refused); true once given. */
export function askToken(reason) {
  asking ??= new Promise((resolve) => {
    const dialog = document.getElementById("token-dialog");
    const input = dialog.querySelector("input[name=token]");
    dialog.querySelector(".reason").textContent = token()
      ? `The server refused the token: ${reason}`
      : `The server needs a token: ${reason}`;
    input.value = "";
    dialog.returnValue = "";
    dialog.addEventListener(
      "close",
      () => {
        asking = null;
        const given = input.value.trim();
        if (dialog.returnValue === "ok" && given) {
          sessionStorage.setItem(KEY, given);
          showSignOut();
          resolve(true);
        } else {
          resolve(false);
        }
      },
      { once: true },
    );
    dialog.showModal();
    input.focus();
  });
  return asking;
}
