from tests.support.tokens import auth_for


async def test_tools_listed_for_member(client):
    response = await client.get("/v1/tools", headers=auth_for("alice"))
    assert response.status_code == 200
    names = [t["function"]["name"] for t in response.json()["tools"]]
    assert names == sorted(names)
    assert "create_article" not in names
