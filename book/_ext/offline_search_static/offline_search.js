// Answers the search page's requests for the book's own pages from window.SEARCH_PAGES (search_pages.js),
// so excerpts show, and nothing is logged, when the book is opened from disk (file://), where fetch is refused.
(() => {
  const pages = window.SEARCH_PAGES || {};
  const fetchFromNetwork = window.fetch.bind(window);
  window.fetch = (resource, options) => {
    const name = typeof resource === "string" ? resource.replace(/^(\.\/)+/, "") : null;
    if (name !== null && Object.hasOwn(pages, name)) {
      return Promise.resolve(new Response(pages[name], { headers: { "Content-Type": "text/html" } }));
    }
    return fetchFromNetwork(resource, options);
  };
})();
