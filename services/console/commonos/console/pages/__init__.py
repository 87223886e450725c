"""The console's pages: one module per page, each exposing `router` (a FastAPI APIRouter) with both routes:

    router = APIRouter(tags=["sessions"])

    class SessionList(BaseModel): ...            # the page's data, typed: the API's response model

    async def load(db, who, ...) -> SessionList  # one query function both routes call

    @router.get("/api/sessions", response_model=SessionList)
    async def api_sessions(who: SignedIn, db: Db, ...) -> SessionList:
        return await load(db, who, ...)

    @router.get("/sessions", include_in_schema=False, response_class=HTMLResponse)
    async def sessions_page(request: Request, who: SignedIn, db: Db, ...) -> HTMLResponse:
        return render(request, "sessions.html", {"page": await load(db, who, ...)})

* Read only through `db.reader(who.user)` (commonos.console.db): row-level security decides what an analyst
  sees; never filter by profile in Python. A row the reader cannot see is a 404, as if it did not exist.
* State-changing routes take `who: CsrfChecked` (commonos.console.auth) and only publish to NATS.
* Templates extend base.html; everything is autoescaped (never `|safe` on data: build markup from escaped
  parts with markupsafe when a page needs it, as the search snippets do).
* `app.create_app` includes every module of this package that has a `router`, in the order of their names.
"""
